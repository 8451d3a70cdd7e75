"""Natural-language prompts as RL feeds them to a chat model: a small corpus the project writes
(math word problems, coding asks, reasoning questions, instructions), rendered with the model's
own chat template up to the assistant's turn. Random token ids put a trained model far outside
anything it was trained on; these keep its next-token distributions as peaked as in a real run
(:func:`conformance.strategies.token_batches` mixes them into drawn batches)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from conformance.errors import UsageError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: user turns: short, varied, the kinds of task RL runs train on (written for this project)
CORPUS: tuple[str, ...] = (
    "A baker makes 14 loaves every hour for 6 hours and sells 59 of them. How many are left?",
    "Lena reads 23 pages a day. How many days does she need for a 368-page novel?",
    "What is 17% of 240? Show your steps.",
    "A train leaves at 9:40 and arrives at 13:05. How long is the journey in minutes?",
    "If 3 pencils cost $1.35, what do 11 pencils cost?",
    "Solve for x: 4x - 7 = 2x + 15.",
    "The sum of three consecutive even numbers is 138. What are they?",
    "A rectangle has a perimeter of 46 cm and one side of 9 cm. What is its area?",
    "How many positive divisors does 360 have?",
    "A tank fills at 12 litres a minute and leaks 3 litres a minute. When is a 540-litre tank "
    "full?",
    "What is the remainder when 2^20 is divided by 7?",
    "Two dice are rolled. What is the probability that the total is 8?",
    "Simplify (x^2 - 9) / (x + 3).",
    "A shop takes 25% off a $64 jacket, then another 10% off the sale price. What is the final "
    "price?",
    "Find the next number in the sequence 2, 6, 12, 20, 30, ...",
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a function that checks whether a string is a palindrome, ignoring case and spaces.",
    "Explain what this does: `sorted(words, key=len, reverse=True)[:3]`",
    "Write a SQL query that lists each customer's total order value, largest first.",
    "Fix the bug: `def mean(xs): return sum(xs) / len(xs) if xs else sum(xs)`",
    "Write a shell one-liner that counts the lines of every .py file under the current folder.",
    "Implement binary search over a sorted list of integers in Python and return the index or -1.",
    "What is the time complexity of inserting into a Python dict, and why?",
    "Write a JavaScript function that removes duplicate values from an array, keeping order.",
    "Explain the difference between a process and a thread in two sentences.",
    "Write a regular expression that matches dates written as YYYY-MM-DD.",
    "Convert this loop to a list comprehension: `out = []\nfor x in xs:\n    if x > 0:\n"
    "        out.append(x * x)`",
    "All roses in the garden are red. Some red flowers wilt by noon. Must some roses wilt by noon?",
    "Mara is taller than Joel, and Joel is taller than Priya. Who is the shortest?",
    "A clock shows 3:15. What is the angle between its hands?",
    "If it takes 5 machines 5 minutes to make 5 widgets, how long do 100 machines take to make "
    "100 widgets?",
    "Which is heavier: a kilogram of feathers or a kilogram of iron? Explain.",
    "A farmer has chickens and cows: 30 heads and 74 legs. How many of each?",
    "Is 221 a prime number? Reason step by step.",
    "You flip a fair coin three times. What is the chance of at least one head?",
    "Three friends split a bill of $87 so that each pays $5 more than the one before. What does "
    "each pay?",
    "Summarise the water cycle in three sentences for a ten-year-old.",
    "Translate into French: 'The library opens at nine on weekdays.'",
    "Give three tips for writing a clear bug report.",
    "Rewrite this sentence in the passive voice: 'The committee approved the new budget.'",
    "List the planets of the solar system in order from the sun.",
    "Write a haiku about a quiet morning in the mountains.",
    "Explain why the sky looks blue, briefly.",
    "Draft a polite email asking a colleague to review a pull request by Friday.",
    "What are the main differences between weather and climate?",
    "Give an example of a metaphor and explain what makes it one.",
    "Name two advantages and one drawback of electric cars.",
    "Describe how to make a cup of tea, in numbered steps.",
    "What does 'opportunity cost' mean? Give an everyday example.",
    "Answer with one word: what is the capital of Canada?",
    "Sort these numbers from smallest to largest: 42, -7, 3.5, 0, 19, -12.",
    "Count the vowels in the word 'encyclopedia'.",
    "Reverse the order of the words in: 'learning never exhausts the mind'.",
    "Put your final answer in a box: what is 123 times 45?",
    "Think step by step, then give the answer: how many minutes are there in a week?",
    "Classify the sentiment of this review as positive or negative: 'The battery died after "
    "two days.'",
    "Extract all the numbers from: 'Order 66 shipped 3 boxes on 12 May for $149.'",
    "Respond in JSON with keys 'city' and 'country' for the Eiffel Tower's location.",
    "A recipe for 4 people needs 300 g of rice. How much rice for 7 people?",
    "Prove that the sum of two odd integers is even.",
)

#: system turns some RL runs put first (drawn with a user turn from :data:`CORPUS`)
SYSTEM_PROMPTS: tuple[str, ...] = (
    "You are a helpful assistant.",
    "You are a careful math tutor. Reason step by step and put the final answer last.",
    "You are an expert programmer. Answer with working code and a short explanation.",
    "Answer concisely.",
)


def rendered_prompts(
    tokenizer: PreTrainedTokenizerBase,
    *,
    corpus: Sequence[str] = CORPUS,
    system_prompts: Sequence[str] = SYSTEM_PROMPTS,
) -> tuple[tuple[int, ...], ...]:
    """Every corpus prompt as the token ids ``tokenizer``'s chat template gives it, up to and
    including the assistant's turn (``add_generation_prompt=True``): first each user turn alone,
    then each with a system turn (the i-th user turn with the (i mod k)-th of the k system
    prompts), where the template takes system turns (some raise on them)."""
    if not corpus:
        raise UsageError("rendered_prompts: corpus is empty", "pass at least one prompt")
    if getattr(tokenizer, "chat_template", None) is None:
        raise UsageError(
            "rendered_prompts: the tokenizer has no chat template",
            "draw random ids for a model without one (token_batches without chat_prompts)",
        )
    from jinja2.exceptions import TemplateError

    def render(messages: list[dict[str, str]]) -> tuple[int, ...]:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        # transformers 5 returns a BatchEncoding; 4 returned the list itself
        return tuple(ids["input_ids"] if hasattr(ids, "keys") else ids)

    user = [render([{"role": "user", "content": text}]) for text in corpus]
    with_system = []
    if system_prompts:
        try:
            with_system = [
                render(
                    [
                        {"role": "system", "content": system_prompts[i % len(system_prompts)]},
                        {"role": "user", "content": text},
                    ]
                )
                for i, text in enumerate(corpus)
            ]
        except TemplateError:
            with_system = []
    return (*user, *with_system)


def chat_prompts(
    tokenizer: PreTrainedTokenizerBase,
    *,
    corpus: Sequence[str] = CORPUS,
    system_prompts: Sequence[str] = SYSTEM_PROMPTS,
) -> SearchStrategy[list[int]]:
    """Return a strategy for one chat-templated prompt as token ids: a corpus prompt, alone or
    after a system prompt, rendered by ``tokenizer``'s chat template up to the assistant's turn
    (see :func:`rendered_prompts`). Shrinks towards the first corpus prompt as a lone user turn.

    - tokenizer: a transformers tokenizer with a chat template.
    - corpus: the user turns to draw from (default :data:`CORPUS`).
    - system_prompts: system turns to pair them with (default :data:`SYSTEM_PROMPTS`).

    >>> chat_prompts(tokenizer).example()  # doctest: +SKIP
    [1, 882, 198, 32, 29412, ...]
    """
    rendered = rendered_prompts(tokenizer, corpus=corpus, system_prompts=system_prompts)
    return st.sampled_from(rendered).map(list)
