"""DSPy: ``Predict`` with a typed signature, its JSON written by the server's constrained decoding.

DSPy sends ``response_format`` only for models its capability table knows (it reports
``supports_response_schema`` False for a local model name), so with a model it does not know its
adapters send plain prompts and a small model's free text fails to parse (``AdapterParseError``).
The fix is one LM argument: ``response_format`` (here the signature's output fields as a pydantic
model) is passed through to every request as is, so the server constrains the answer to exactly
the JSON ``dspy.JSONAdapter`` parses."""

from __future__ import annotations

import dspy
from common import API_KEY, BASE_MODEL, BASE_URL
from pydantic import BaseModel


class Capital(dspy.Signature):
    """Name the capital city of the country."""

    country: str = dspy.InputField()
    capital: str = dspy.OutputField()
    population_millions: float = dspy.OutputField()


class CapitalOutput(BaseModel):  # the signature's output fields, as the JSON the server must write
    capital: str
    population_millions: float


lm = dspy.LM(
    f"openai/{BASE_MODEL}",
    api_base=BASE_URL,
    api_key=API_KEY,
    temperature=0,
    max_tokens=200,
    cache=False,
    response_format=CapitalOutput,  # the one setting: DSPy passes it to the server as is
)
dspy.configure(lm=lm, adapter=dspy.JSONAdapter())
prediction = dspy.Predict(Capital)(country="France")
print("capital:", prediction.capital)
print("population_millions:", prediction.population_millions)
