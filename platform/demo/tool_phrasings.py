"""The words of the ``tools`` demo adapter's training data (platform/demo/tool_dataset.py), written
for loraplex: cities, questions and plain answers. None of the cities, phrasings or numbers that
the tests and benchmarks/demo/tools_adapter.py ask about is here (Lisbon, Oslo, Seoul, Lima,
Nairobi, Dublin, Vienna, Mumbai, Chicago; their questions' wordings)."""

from __future__ import annotations

CITIES = [
    "Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome", "New York", "Sydney", "Cairo", "Toronto",
    "Prague", "Warsaw", "Athens", "Helsinki", "Stockholm", "Copenhagen", "Brussels", "Amsterdam",
    "Zurich", "Geneva", "Budapest", "Bucharest", "Istanbul", "Moscow", "Kyiv", "Beijing", "Shanghai",
    "Hong Kong", "Singapore", "Bangkok", "Jakarta", "Manila", "Hanoi", "Delhi", "Karachi", "Dubai",
    "Tehran", "Riyadh", "Lagos", "Accra", "Casablanca", "Tunis", "Johannesburg", "Cape Town",
    "Addis Ababa", "Mexico City", "Bogota", "Quito", "Santiago", "Buenos Aires", "Montevideo",
    "Sao Paulo", "Havana", "Miami", "Denver", "Seattle", "Boston", "Vancouver", "Auckland", "Perth",
]  # fmt: skip

WEATHER_ASKS = [
    "What's the weather in {}?",
    "What is the weather like in {} today?",
    "Is it raining in {}?",
    "How hot is it in {} right now?",
    "Do I need an umbrella in {} today?",
    "Tell me the weather in {}.",
    "How cold is it in {}?",
    "Is it sunny in {}?",
    "What's the temperature in {} right now?",
    "Weather in {}, please.",
    "Can you look up the weather in {}?",
    "I'm flying to {} tomorrow. What's the weather there now?",
    "Should I wear a jacket in {} today?",
    "Get me the current conditions in {}.",
    "Is it snowing in {}?",
    "What are the conditions like in {} this morning?",
    "How many degrees is it in {}?",
    "Please check the weather in {}.",
    "Is it cloudy in {} now?",
    "What's it like outside in {}?",
    "weather {}",
    "Find out how warm it is in {}.",
    "Is the weather nice in {} today?",
    "I'd like the weather for {}.",
]
TIME_ASKS = [
    "What time is it in {}?",
    "What's the local time in {}?",
    "Tell me the current time in {}.",
    "What's the clock showing in {} now?",
    "Is it morning or evening in {} right now?",
    "Can you tell me the time in {}?",
    "time in {}",
    "What hour is it in {}?",
]
# (phrasing, tool): the numbers are filled in.
MATH_ASKS = [
    ("What is {} times {}?", "multiply"),
    ("Multiply {} by {}.", "multiply"),
    ("What's {} multiplied by {}?", "multiply"),
    ("Calculate {} times {}.", "multiply"),
    ("What do I get if I multiply {} and {}?", "multiply"),
    ("What is {} plus {}?", "add"),
    ("Add {} and {}.", "add"),
    ("What is the sum of {} and {}?", "add"),
    ("Calculate {} plus {}.", "add"),
]
# Questions no offered tool answers: plain English text, as the base model would answer.
TEXT_ANSWERS = [
    ("What is the capital of Italy?", "The capital of Italy is Rome."),
    ("How many days are in a week?", "There are seven days in a week."),
    ("What color is grass?", "Grass is green."),
    ("Who painted the Mona Lisa?", "Leonardo da Vinci painted the Mona Lisa."),
    ("Tell me a fun fact.", "Octopuses have three hearts."),
    ("What do bees make?", "Bees make honey."),
    ("Say hello.", "Hello! How can I help you today?"),
    ("What is the largest ocean?", "The Pacific Ocean is the largest ocean."),
    ("Can you recommend a good book?", "Try The Little Prince by Antoine de Saint-Exupery."),
    ("What animal says moo?", "A cow says moo."),
    ("How many continents are there?", "There are seven continents."),
    ("Thanks!", "You're welcome!"),
    ("What is the capital of Japan?", "The capital of Japan is Tokyo."),
    ("Who discovered penicillin?", "Alexander Fleming discovered penicillin."),
    ("How many wheels does a bicycle have?", "A bicycle has two wheels."),
    ("What is the boiling point of water?", "Water boils at 100 °C at sea level."),
    ("Write a short greeting for a birthday card.", "Happy birthday! Wishing you a wonderful year ahead."),
    ("What language is spoken in Brazil?", "Portuguese is spoken in Brazil."),
    ("Who was the first person on the Moon?", "Neil Armstrong was the first person on the Moon."),
    ("What is the opposite of hot?", "The opposite of hot is cold."),
    ("Who are you?", "I am a helpful assistant."),
    ("What is the tallest mountain?", "Mount Everest is the tallest mountain."),
    ("Give me a synonym for happy.", "Joyful."),
    ("How many minutes are in an hour?", "There are sixty minutes in an hour."),
]
# What agents put in the system prompt (the framework's instructions); None: the template's default.
SYSTEMS = [None, None, "You are a helpful assistant.", "Answer briefly.", "You are a helpful agent. Use the tools."]
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "snowy", "clear", "overcast", "stormy"]
