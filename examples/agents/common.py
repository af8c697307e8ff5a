"""Where the examples find the server: ``loraplex serve`` (demo mode) prints the demo tenant's key;
``loraplex demo adapters`` trains and registers the ``tools`` adapter these examples use."""

from __future__ import annotations

import os

BASE_URL = os.environ.get("LORAPLEX_BASE_URL", "http://127.0.0.1:8000/v1")
API_KEY = os.environ.get("LORAPLEX_API_KEY", "lpx-...")  # the demo key `loraplex serve` printed
TOOLS_MODEL = "tools"  # the demo adapter trained on agent turns (platform/demo/tool_dataset.py)
BASE_MODEL = "SmolLM2-135M-Instruct"

WEATHER = {
    "Paris": {"temperature_c": 18, "conditions": "sunny"},
    "Oslo": {"temperature_c": 4, "conditions": "snowy"},
}


def weather_of(city: str) -> dict:
    """The examples' weather service (canned, so a run's answer can be checked)."""
    return {"city": city, **WEATHER.get(city, {"temperature_c": 21, "conditions": "cloudy"})}
