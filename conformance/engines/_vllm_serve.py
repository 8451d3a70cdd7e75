"""``python -m conformance.engines._vllm_serve FLAGS``: vLLM's API server (``python -m
vllm.entrypoints.openai.api_server FLAGS``) in processes that hold the AMX tile-data permission
its bf16 attention kernel needs (:func:`~conformance.engines._vllm_internals.grant_amx_tiles`).

Linux clears the permission at exec, and the server spawns its engine core: a spawned child
imports this module again as its main one, so the request is made at import, in each process.
"""

import runpy

from conformance.engines._vllm_internals import API_SERVER_MODULE, grant_amx_tiles

grant_amx_tiles()

if __name__ == "__main__":
    # sys.modules["__main__"] stays this module, which spawned children import
    runpy.run_module(API_SERVER_MODULE, run_name="__main__", alter_sys=False)
