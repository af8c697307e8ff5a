"""DSPy: ``Predict`` with a typed signature. ``dspy.JSONAdapter()`` is the documented setting that
makes DSPy send ``response_format`` (JSON mode), so the server's constrained decoding writes the
JSON DSPy parses; with DSPy's default ChatAdapter a model DSPy does not know gets no
``response_format`` and a small model's free text fails to parse (AdapterParseError)."""

from __future__ import annotations

import dspy
from common import API_KEY, BASE_MODEL, BASE_URL


class Capital(dspy.Signature):
    """Name the capital city of the country."""

    country: str = dspy.InputField()
    capital: str = dspy.OutputField()
    population_millions: float = dspy.OutputField()


lm = dspy.LM(f"openai/{BASE_MODEL}", api_base=BASE_URL, api_key=API_KEY, temperature=0, max_tokens=200, cache=False)
dspy.configure(lm=lm, adapter=dspy.JSONAdapter())
prediction = dspy.Predict(Capital)(country="France")
print("capital:", prediction.capital)
print("population_millions:", prediction.population_millions)
