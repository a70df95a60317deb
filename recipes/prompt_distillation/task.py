"""The prompt-distillation task, shared by its two steps (``create_data`` labels, ``train`` measures): identify a
sentence's language with a two-letter code. The teacher's prompt, the embedded sentences and their split, and the
reply checks live here."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Literal

from tinker_cookbook import renderers

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
