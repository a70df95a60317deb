"""Generate ``conversations.jsonl``: the project's example fine-tuning data (contact-card extraction).

    python example-data/make_conversations.py            # rewrites example-data/conversations.jsonl

Each conversation gives a short, free-form description of a person and the assistant answers with a contact
card in one fixed format::

    Name: Maria Lopez
    Age: 34
    City: Lisbon
    Job: nurse

Facts the description does not mention are written ``unknown``; hobbies and other details are left out. A small
model learns the format and the copy-from-the-prompt rule within a few dozen steps, so the held-out loss falls
visibly in minutes on a CPU. About one conversation in five has a second turn with another person. The output
is deterministic (fixed seed).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SEED = 20260
NUM_CONVERSATIONS = 320

FIRST_NAMES = [
    "Maria", "Ahmed", "Yuki", "Olivia", "Chen", "Lucas", "Amara", "Sofia", "Ivan", "Priya", "Mateo", "Hannah",
    "Kwame", "Elena", "Tariq", "Ingrid", "Rafael", "Mei", "Jonas", "Fatima", "Diego", "Aisha", "Noah", "Lena",
    "Omar", "Clara", "Kenji", "Zanele", "Pavel", "Lucia", "Samuel", "Nadia", "Hugo", "Freya", "Arjun", "Rosa",
    "Tomas", "Leila", "Felix", "Ana", "Bruno", "Sara", "Emil", "Grace", "Ravi", "Julia", "Malik", "Eva",
]
LAST_NAMES = [
    "Lopez", "Haddad", "Tanaka", "Brown", "Wang", "Silva", "Okafor", "Rossi", "Petrov", "Sharma", "Garcia",
    "Schmidt", "Mensah", "Popescu", "Khan", "Larsen", "Costa", "Lin", "Weber", "Rahman", "Moreno", "Bello",
    "Smith", "Novak", "Nasser", "Dubois", "Sato", "Dlamini", "Horvat", "Ferrari", "Adeyemi", "Jensen",
]
CITIES = [
    "Lisbon", "Cairo", "Osaka", "Toronto", "Chengdu", "Porto Alegre", "Lagos", "Milan", "Kazan", "Pune",
    "Valencia", "Hamburg", "Accra", "Cluj", "Karachi", "Bergen", "Recife", "Taipei", "Vienna", "Dhaka",
    "Bogota", "Nairobi", "Leeds", "Brno", "Amman", "Lyon", "Sapporo", "Durban", "Zagreb", "Turin", "Quito",
    "Aarhus", "Denver", "Perth", "Seville", "Krakow",
]
JOBS = [
    "nurse", "software engineer", "teacher", "chef", "architect", "electrician", "pharmacist", "journalist",
    "farmer", "pilot", "accountant", "photographer", "carpenter", "librarian", "dentist", "translator",
    "firefighter", "veterinarian", "baker", "lawyer", "mechanic", "biologist", "barista", "plumber",
    "graphic designer", "tailor", "data analyst", "bus driver", "physiotherapist", "florist",
]
HOBBIES = [
    "plays the violin", "collects old maps", "runs marathons", "grows tomatoes", "paints watercolours",
    "builds model trains", "swims every morning", "writes short stories", "climbs mountains", "keeps bees",
    "bakes sourdough", "plays chess online", "restores old bicycles", "sings in a choir",
]
INSTRUCTIONS = [
    "Make a contact card for this person.",
    "Extract a contact card:",
    "Turn this into a contact card.",
    "Contact card, please:",
    "Please fill in a contact card from this description.",
    "",
]
SYSTEM_PROMPT = "You write contact cards. Answer only with the card: Name, Age, City and Job, one per line."


def describe(person: dict[str, str | None], rng: random.Random) -> str:
    """A free-form sentence or two about ``person``, mentioning only the facts that are not None."""
    name, age, city, job = person["name"], person["age"], person["city"], person["job"]
    parts = []
    if age is not None:
        parts.append(rng.choice([f"is {age} years old", f"is {age}", f"turned {age} this year"]))
    if city is not None:
        parts.append(rng.choice([f"lives in {city}", f"is based in {city}", f"moved to {city} recently"]))
    if job is not None:
        article = "an" if job[0] in "aeiou" else "a"
        parts.append(rng.choice([f"works as {article} {job}", f"is {article} {job}", f"has a job as {article} {job}"]))
    rng.shuffle(parts)
    if not parts:
        parts = ["did not tell us much"]
    sentence = f"{name} " + (", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]) + "."
    if rng.random() < 0.4:
        pronoun = rng.choice(["They", "In their free time they", "On weekends they"])
        hobby = rng.choice(HOBBIES)
        # "They plays" -> "They play": conjugate the hobby verb for a plural pronoun.
        verb, rest = hobby.split(" ", 1)
        verb = verb[:-2] if verb.endswith("es") and verb[:-2].endswith(("sh", "ch")) else verb[:-1]
        sentence += f" {pronoun} {verb} {rest}."
    if rng.random() < 0.25:
        sentence = rng.choice(["Here is someone: ", "Note from the front desk: ", "New member: "]) + sentence
    return sentence


def card(person: dict[str, str | None]) -> str:
    return "\n".join(
        f"{field}: {person[key] if person[key] is not None else 'unknown'}"
        for field, key in (("Name", "name"), ("Age", "age"), ("City", "city"), ("Job", "job"))
    )


def random_person(rng: random.Random) -> dict[str, str | None]:
    def maybe(value: str) -> str | None:
        return None if rng.random() < 0.12 else value

    return {
        "name": f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}",
        "age": maybe(str(rng.randint(18, 79))),
        "city": maybe(rng.choice(CITIES)),
        "job": maybe(rng.choice(JOBS)),
    }


def user_message(person: dict[str, str | None], rng: random.Random) -> str:
    instruction = rng.choice(INSTRUCTIONS)
    text = describe(person, rng)
    return f"{instruction}\n{text}" if instruction else text


def conversation(rng: random.Random) -> dict[str, list[dict[str, str]]]:
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    for _ in range(2 if rng.random() < 0.2 else 1):
        person = random_person(rng)
        messages.append({"role": "user", "content": user_message(person, rng)})
        messages.append({"role": "assistant", "content": card(person)})
    return {"messages": messages}


def main() -> None:
    rng = random.Random(SEED)
    out = Path(__file__).resolve().parent / "conversations.jsonl"
    with open(out, "w") as f:
        f.writelines(json.dumps(conversation(rng)) + "\n" for _ in range(NUM_CONVERSATIONS))
    print(f"wrote {NUM_CONVERSATIONS} conversations to {out}")


if __name__ == "__main__":
    main()
