"""The embedded data set: short English sentences with numbers, in German or French.

Every pair is built from a template, a noun, a place or name and a number spelled out by
``num2words``::

    en: I know that Anna has four hundred and ninety-seven apples.
    de: Ich weiß, dass Anna vierhundertsiebenundneunzig Äpfel hat.
    fr: Je sais que Anna a quatre cent quatre-vingt-dix-sept pommes.

It is small, deterministic per seed and needs no download, yet it is real language with the
phenomena attention has to handle: the German verb moves to the end of a subordinate clause
("dass ... hat") and after a fronted phrase ("Im Garten sind ..."), a perfect tense splits
("hat ... gekauft"), and number words reorder ("ninety-seven" -> "sieben-und-neunzig") and
fuse into one German word. Sentences have several words, so BLEU is meaningful (a bare
number, one German word, has no 4-grams to count).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# (English plural, German plural, French plural)
NOUNS: list[tuple[str, str, str]] = [
    ("apples", "Äpfel", "pommes"),
    ("books", "Bücher", "livres"),
    ("cars", "Autos", "voitures"),
    ("birds", "Vögel", "oiseaux"),
    ("chairs", "Stühle", "chaises"),
    ("houses", "Häuser", "maisons"),
    ("dogs", "Hunde", "chiens"),
    ("cats", "Katzen", "chats"),
    ("trees", "Bäume", "arbres"),
    ("flowers", "Blumen", "fleurs"),
    ("bottles", "Flaschen", "bouteilles"),
    ("letters", "Briefe", "lettres"),
    ("stones", "Steine", "pierres"),
    ("tickets", "Karten", "billets"),
    ("boats", "Boote", "bateaux"),
    ("glasses", "Gläser", "verres"),
]
# (English "in the X", German dative phrase, French phrase)
PLACES: list[tuple[str, str, str]] = [
    ("in the garden", "im Garten", "dans le jardin"),
    ("in the kitchen", "in der Küche", "dans la cuisine"),
    ("in the house", "im Haus", "dans la maison"),
    ("in the city", "in der Stadt", "dans la ville"),
    ("in the box", "in der Kiste", "dans la boîte"),
    ("in the park", "im Park", "dans le parc"),
    ("in the village", "im Dorf", "dans le village"),
    ("in the shop", "im Laden", "dans le magasin"),
]
NAMES: list[str] = ["Anna", "Peter", "Maria", "Paul", "Lisa", "Thomas", "Sophie", "Max"]
# (English, German, French) purpose phrases
EVENTS: list[tuple[str, str, str]] = [
    ("for the party", "für die Feier", "pour la fête"),
    ("for the trip", "für die Reise", "pour le voyage"),
    ("for the wedding", "für die Hochzeit", "pour le mariage"),
    ("for the weekend", "für das Wochenende", "pour le week-end"),
    ("for the school", "für die Schule", "pour l'école"),
]
DAYS: list[tuple[str, str, str]] = [
    ("yesterday", "gestern", "hier"),
    ("today", "heute", "aujourd'hui"),
    ("on Monday", "am Montag", "lundi"),
    ("on Friday", "am Freitag", "vendredi"),
]

# Each template gets (number, noun, place, name, event, day) in one language and returns the
# sentence. German word order differs from English in every template but the fourth.
TEMPLATES: dict[str, list[str]] = {
    "en": [
        "There are {n} {noun} {place}.",
        "I know that {name} has {n} {noun}.",
        "{name} bought {n} {noun} {day}.",
        "We need {n} {noun} {event}.",
        "{day_cap}, {name} saw {n} {noun} {place}.",
    ],
    "de": [
        "{place_cap} sind {n} {noun}.",
        "Ich weiß, dass {name} {n} {noun} hat.",
        "{name} hat {day} {n} {noun} gekauft.",
        "Wir brauchen {n} {noun} {event}.",
        "{day_cap} hat {name} {n} {noun} {place} gesehen.",
    ],
    "fr": [
        "Il y a {n} {noun} {place}.",
        "Je sais que {name} a {n} {noun}.",
        "{name} a acheté {n} {noun} {day}.",
        "Nous avons besoin de {n} {noun} {event}.",
        "{day_cap}, {name} a vu {n} {noun} {place}.",
    ],
}
_COLUMN = {"en": 0, "de": 1, "fr": 2}


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def spell(numbers: Sequence[int], lang: str) -> list[str]:
    """Cardinal number words in ``lang`` (en, de, fr, ...) via ``num2words``."""
    from num2words import num2words

    try:
        return [num2words(int(n), lang=lang) for n in numbers]
    except NotImplementedError:
        raise ValueError(
            f"num2words cannot spell numbers in {lang!r}; pick e.g. en, de or fr."
        ) from None


def number_sentences(
    numbers: Sequence[int], src_lang: str, tgt_lang: str, seed: int
) -> tuple[list[str], list[str]]:
    """One sentence pair per number: random template and fillers, deterministic per seed."""
    for lang in (src_lang, tgt_lang):
        if lang not in TEMPLATES:
            raise ValueError(
                f"the number-sentence task has no templates for {lang!r}; "
                f"use data.src_lang/data.tgt_lang from {sorted(TEMPLATES)}"
            )
    rng = np.random.default_rng(seed)
    n = len(numbers)
    picks = {
        "template": rng.integers(len(TEMPLATES["en"]), size=n),
        "noun": rng.integers(len(NOUNS), size=n),
        "place": rng.integers(len(PLACES), size=n),
        "name": rng.integers(len(NAMES), size=n),
        "event": rng.integers(len(EVENTS), size=n),
        "day": rng.integers(len(DAYS), size=n),
    }
    out: dict[str, list[str]] = {}
    for lang in (src_lang, tgt_lang):
        col = _COLUMN[lang]
        words = spell(numbers, lang)
        sentences = []
        for i in range(n):
            day = DAYS[picks["day"][i]][col]
            place = PLACES[picks["place"][i]][col]
            text = TEMPLATES[lang][picks["template"][i]].format(
                n=words[i],
                noun=NOUNS[picks["noun"][i]][col],
                place=place,
                place_cap=_cap(place),
                name=NAMES[picks["name"][i]],
                event=EVENTS[picks["event"][i]][col],
                day=day,
                day_cap=_cap(day),
            )
            sentences.append(_cap(text))
        out[lang] = sentences
    return out[src_lang], out[tgt_lang]
