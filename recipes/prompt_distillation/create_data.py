"""Prompt distillation, step 1: a teacher (the model WITH a long system prompt) labels sentences; the data keeps
the sentences WITHOUT the prompt, so that a student trained on it (``.train``) behaves as if it had the prompt.

    python -m recipes.prompt_distillation.create_data            # SmolLM2-135M-Instruct teacher, offline, ~1 min
    python -m recipes.prompt_distillation.create_data output_file=/tmp/tinker-datasets/prompt_distillation_lang.jsonl
    python -m recipes.prompt_distillation.create_data model_name=Qwen/Qwen3-30B-A3B temperature=0.7 samples_per_input=4

The docs' spelling, ``python -m tinker_cookbook.recipes.prompt_distillation.create_data``, runs this same file.

The behaviour is the docs' example: reply with only the two-letter code of the sentence's language (``LABELS``;
``ot`` for anything else, code and bare numbers included). The teacher's prompt is a long system message with the
rules plus one solved example per label (small models follow examples far better than rules alone: SmolLM2-135M
with the rules alone never replied with just a code). The sentences are embedded below (``SENTENCES``, ten
languages plus ``ot``); every fourth of each language is held out (``split``) and never labelled here: ``.train``
measures on them how often the student follows the behaviour. ``target=label`` (default) keeps the label the teacher
replied with and drops replies that do not start with one (the teacher is a small model: it does not always follow
its prompt); ``target=raw`` keeps the teacher's reply as it is, as in the docs' formula (r_i = f_T([P, q_i])).
Rows are ``{"messages": [{"role": "user", ...}, {"role": "assistant", ...}]}``, the format of every SFT recipe.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import tempfile
from pathlib import Path
from typing import Literal

import chz

from tinker_cookbook import renderers, tinker
from tinker_cookbook.cli_utils import run_recipe
from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.supervised.types import resolve_renderer_name
from tinker_cookbook.tokenizer_utils import get_tokenizer

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
LABELS = {"ar": "Arabic", "de": "German", "el": "Greek", "en": "English", "es": "Spanish", "fr": "French",
          "hi": "Hindi", "ru": "Russian", "tr": "Turkish", "ur": "Urdu", "vi": "Vietnamese",
          "zh": "Chinese (Simplified)", "ot": "Other/Unknown"}
TEACHER_PROMPT = f"""You are a language identification service. Every user message is a piece of text whose \
language you must identify. You never answer the text, translate it, explain it or repeat it.

Reply with exactly one two-letter code and nothing else: no punctuation, no words, no explanation. The codes are:
{chr(10).join(f"- {code}: {name}" for code, name in LABELS.items())}

Rules:
1. The code names the language the text is written in, not the language it talks about: "I love French food" is en.
2. Text in several languages: the code of the language most of the words are in.
3. Source code, bare numbers, formulas, URLs, or a language that is not listed: ot.
4. Your whole reply is the code, for example:
User: Guten Morgen, wie geht es dir?
Assistant: de
User: print(sum(range(10)))
Assistant: ot"""

SENTENCES: dict[str, list[str]] = {
    "en": ["The weather is lovely this morning.", "Could you send me the report before lunch?",
           "My brother plays the guitar every evening.", "We missed the last train home.",
           "This soup needs a little more salt.", "The library closes at eight on Fridays.",
           "She planted tomatoes along the fence.", "Please turn off the lights when you leave."],
    "de": ["Das Wetter ist heute wirklich schön.", "Kannst du mir bitte das Salz geben?",
           "Wir fahren morgen mit dem Zug nach Berlin.", "Mein Hund schläft den ganzen Tag.",
           "Die Besprechung wurde auf Donnerstag verschoben.", "Ich habe meinen Schlüssel verloren.",
           "Im Winter trinken wir gern heißen Tee.", "Das Museum ist montags geschlossen."],
    "fr": ["Il fait très beau aujourd'hui.", "Je voudrais un café, s'il vous plaît.",
           "Nous partons en vacances la semaine prochaine.", "Le chat dort sur le canapé.",
           "Elle apprend le piano depuis trois ans.", "La boulangerie ouvre à sept heures.",
           "Ils ont repeint la cuisine en jaune.", "Où se trouve la gare, s'il vous plaît ?"],
    "es": ["Hoy hace mucho calor en la ciudad.", "¿Dónde está la biblioteca?",
           "Mi abuela cocina paella los domingos.", "Vamos a la playa este fin de semana.",
           "El tren llega con diez minutos de retraso.", "Necesito comprar pan y leche.",
           "Los niños juegan en el parque.", "Me gusta leer antes de dormir."],
    "ru": ["Сегодня на улице очень холодно.", "Где находится ближайшая аптека?",
           "Мы смотрели фильм вчера вечером.", "Моя сестра работает в больнице.",
           "Поезд отправляется в шесть часов.", "Я люблю гулять в парке осенью.",
           "Пожалуйста, закройте окно.", "Этот суп очень вкусный."],
    "zh": ["今天天气很好。", "请问火车站在哪里？", "我每天早上喝一杯咖啡。", "他们周末去公园散步。",
           "这本书非常有意思。", "我的妹妹在大学学习医学。", "晚饭已经准备好了。", "明天我们要去北京。"],
    "ar": ["الطقس جميل جدا اليوم.", "أين يقع المطار من فضلك؟", "أحب قراءة الكتب في المساء.",
           "ذهبنا إلى السوق يوم الجمعة.", "أخي يعمل مهندسا في الشركة.", "القهوة ساخنة جدا.",
           "سنسافر إلى القاهرة الأسبوع القادم.", "المدرسة قريبة من بيتنا."],
    "el": ["Ο καιρός είναι υπέροχος σήμερα.", "Πού είναι η παραλία, παρακαλώ;",
           "Μου αρέσει πολύ το ελληνικό φαγητό.", "Το λεωφορείο αργεί πάλι.",
           "Η γιαγιά μου φτιάχνει γλυκά.", "Θα πάμε στο θέατρο απόψε.",
           "Τα παιδιά παίζουν στην αυλή.", "Έχασα τα κλειδιά μου."],
    "tr": ["Bugün hava çok güzel.", "Otobüs durağı nerede?", "Akşam yemeğinde balık yedik.",
           "Kardeşim üniversitede okuyor.", "Yarın sabah erken kalkmam gerekiyor.", "Bu kitabı çok beğendim.",
           "Kahvaltıda peynir ve zeytin var.", "Hafta sonu denize gideceğiz."],
    "vi": ["Hôm nay trời rất đẹp.", "Nhà ga ở đâu vậy?", "Tôi thích uống cà phê sữa đá.",
           "Chúng tôi đi chợ vào buổi sáng.", "Em gái tôi học ở Hà Nội.", "Món phở này rất ngon.",
           "Ngày mai tôi phải đi làm sớm.", "Bọn trẻ đang chơi ngoài sân."],
    "ot": ["def add(a, b):\n    return a + b", "3.14159 2.71828 1.41421", "SELECT name FROM users WHERE id = 7;",
           "https://example.com/index.html", "for (int i = 0; i < n; i++) { total += i; }", "42 + 17 = 59",
           "x = np.zeros((3, 3))", "12/03/2024 08:45"],
}
_LEADING_LABEL = re.compile(r"\s*[\"'`*]*([a-z]{2})(?![a-z])", re.IGNORECASE)


def split(which: Literal["shots", "train", "held_out"]) -> list[tuple[str, str]]:
    """(sentence, language) pairs. Per language: the first sentence is a worked example inside the teacher's prompt,
    every fourth is held out for measuring the student, the rest are the inputs the teacher labels."""

    def part(index: int) -> str:
        return "shots" if index == 0 else "held_out" if index % 4 == 3 else "train"

    return [(s, code) for code, sentences in SENTENCES.items() for i, s in enumerate(sentences) if part(i) == which]


def reply_label(reply: str) -> str | None:
    """The label a reply starts with ("fr", "fr.", "FR (French)"), or None when it does not start with one."""
    match = _LEADING_LABEL.match(reply)
    code = match.group(1).lower() if match else None
    return code if code in LABELS else None


def follows(reply: str) -> bool:
    """The behaviour itself: the whole reply is one label."""
    return reply.strip() in LABELS


def teacher_messages(sentence: str) -> list[renderers.Message]:
    """The teacher's prompt P (the system message and one solved example per label) followed by the query."""
    messages = [renderers.Message(role="system", content=TEACHER_PROMPT)]
    for shot, code in split("shots"):
        messages += [renderers.Message(role="user", content=shot), renderers.Message(role="assistant", content=code)]
    return [*messages, renderers.Message(role="user", content=sentence)]


def default_output_file() -> str:
    return str(Path(tempfile.gettempdir()) / "tinker-datasets" / "prompt_distillation_lang.jsonl")


@chz.chz
class Config:
    """Teacher sampling settings."""

    model_name: str = DEFAULT_MODEL
    """The teacher: this base model, prompted with TEACHER_PROMPT."""
    renderer_name: str | None = None
    """None: the model's recommended renderer."""
    output_file: str = chz.field(default_factory=default_output_file)
    """Where the JSONL of (sentence without the prompt -> teacher reply) rows is written."""
    target: Literal["label", "raw"] = "label"
    """label: the label the teacher replied with (replies without one are dropped); raw: the whole reply."""
    temperature: float = 0.0
    """Teacher sampling temperature (0: greedy, one reply per input whatever samples_per_input says)."""
    samples_per_input: int = 1
    """Teacher replies per sentence (with temperature > 0 they differ)."""
    max_tokens: int = 16
    """Longest teacher reply; a label needs two or three tokens."""
    max_inputs: int | None = None
    """Label only the first this many training sentences (None: all of them); for quick trials."""


async def teacher_replies(config: Config, sentences: list[str]) -> list[list[str]]:
    """``samples_per_input`` teacher replies per sentence, all requested at once (the sampler batches them)."""
    name = resolve_renderer_name(config.model_name, config.renderer_name)
    renderer = renderers.get_renderer(name, get_tokenizer(config.model_name), model_name=config.model_name)
    client = tinker.ServiceClient().create_sampling_client(base_model=config.model_name)
    n = 1 if config.temperature == 0 else config.samples_per_input
    params = tinker.SamplingParams(max_tokens=config.max_tokens, temperature=config.temperature,
                                   stop=renderer.get_stop_sequences())

    async def sample(sentence: str) -> list[str]:
        prompt = renderer.build_generation_prompt(teacher_messages(sentence))
        response = await client.sample_async(prompt=prompt, num_samples=n, sampling_params=params)
        return [renderers.get_text_content(renderer.parse_response(seq.tokens)[0]) for seq in response.sequences]

    return list(await asyncio.gather(*(sample(s) for s in sentences)))


def main(config: Config) -> None:
    if config.samples_per_input < 1:
        raise ConfigurationError(f"samples_per_input={config.samples_per_input} must be at least 1")
    pairs = split("train")[: config.max_inputs]
    replies = asyncio.run(teacher_replies(config, [s for s, _ in pairs]))
    rows, n_replies, n_follow, n_correct = [], 0, 0, 0
    for (sentence, language), sentence_replies in zip(pairs, replies, strict=True):
        for reply in sentence_replies:
            label = reply_label(reply)
            n_replies += 1
            n_follow += follows(reply)
            n_correct += label == language
            target = reply if config.target == "raw" else label
            if target is not None:
                rows.append({"messages": [{"role": "user", "content": sentence},
                                          {"role": "assistant", "content": target}]})
    print(f"teacher: {n_follow}/{n_replies} replies are exactly a label, {n_correct}/{n_replies} name the right "
          f"language; {len(rows)} rows kept (target={config.target})")
    if not rows:
        raise ConfigurationError(
            f"the teacher {config.model_name!r} started none of its {n_replies} replies with a label, so there is "
            "nothing to distil; use a stronger teacher (model_name=...), or target=raw to keep its replies as they are")
    out = Path(config.output_file).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    print(f"wrote {len(rows)} rows to {out}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    run_recipe(main)
