"""A small multilingual corpus for benches that need realistic prompts: English, French, German, Chinese prose and
source code, a few paragraphs each (written for kvscope; no outside text)."""

from __future__ import annotations

import random

CORPUS: dict[str, list[str]] = {
    "en": [
        "The river runs past the old mill and under the stone bridge, where the children wait for the evening light "
        "to fall across the water. A boat drifts slowly toward the sea, its sail patched in three colours, and the "
        "ferryman counts the coins in his pocket twice before he lights his pipe.",
        "In the spring the orchard smells of wet bark and blossom. The beekeeper walks between the rows with a "
        "smoking tin, lifting each lid as gently as a letter from someone she has not seen in years, and writes the "
        "weight of every frame into a notebook gone soft at the corners.",
        "Memory in a language model is not a diary but a cache: each token leaves a key and a value in every layer, "
        "and the next token reads them all. Save that cache to disk and you can resume a conversation without "
        "reading the whole prompt again, provided the numbers come back exactly as they were.",
    ],
    "fr": [
        "Le marché ouvre avant l'aube. Les marchands de légumes disposent les poireaux en fagots serrés, la "
        "fromagère coupe une meule de comté en triangles réguliers, et l'odeur du pain chaud remonte la rue jusqu'à "
        "la fontaine où les pigeons se disputent les miettes de la veille.",
        "Il pleuvait depuis trois jours lorsque le facteur frappa à la porte. Il tenait une enveloppe jaunie, "
        "adressée à une femme qui avait quitté le village bien avant la guerre, et personne ne savait plus très bien "
        "s'il fallait l'ouvrir, la renvoyer ou simplement la garder dans le tiroir de la cuisine.",
    ],
    "de": [
        "Der Zug hielt mitten im Wald, ohne dass jemand eine Durchsage machte. Die Fahrgäste sahen einander an, "
        "einige lachten, andere holten ihre Bücher hervor, und ein kleiner Junge drückte die Stirn an die kalte "
        "Scheibe, um die Rehe zu zählen, die zwischen den Fichten standen.",
        "Wer eine Brücke baut, rechnet nicht nur mit dem Gewicht der Autos, sondern auch mit dem Wind, mit dem Frost "
        "im Winter und mit der Hitze im August, die den Stahl um einige Zentimeter wachsen lässt. Deshalb hat jede "
        "große Brücke Fugen, die man beim Darüberfahren leise klappern hört.",
    ],
    "zh": [
        "清晨的山谷里雾气很重，村口的老槐树只露出半截树冠。赶集的人挑着担子走过石板路，竹筐里装着新摘的青菜和刚下的鸡蛋。"
        "远处传来几声狗叫，接着是学校的铃声，孩子们一边跑一边喊着彼此的名字。",
        "语言模型在生成文字时，会把每一个词元的键和值保存在缓存里。只要把这份缓存完整地写到磁盘上，下次就可以接着上次的对话继续，"
        "而不必重新计算整段提示。问题在于，读回来的数字必须和原来的一模一样。",
    ],
    "code": [
        "def merge_intervals(items):\n    items = sorted(items)\n    out = []\n    for lo, hi in items:\n"
        "        if out and lo <= out[-1][1]:\n            out[-1][1] = max(out[-1][1], hi)\n        else:\n"
        "            out.append([lo, hi])\n    return out\n\n\nprint(merge_intervals([[1, 3], [2, 6], [8, 10]]))\n",
        "struct kv_cell {\n    int32_t pos;\n    uint32_t seq_mask;\n};\n\nstatic size_t count_used(const struct "
        "kv_cell *cells, size_t n) {\n    size_t used = 0;\n    for (size_t i = 0; i < n; i++) {\n"
        "        if (cells[i].seq_mask != 0) used++;\n    }\n    return used;\n}\n",
    ],
}
LANGS = (*CORPUS, "mixed")


def passage(lang: str, rng: random.Random, n_chars: int) -> str:
    """About ``n_chars`` characters of ``lang`` (``mixed``: every language in turn), starting at a drawn paragraph
    and cycling through the others."""
    paras = [p for key in CORPUS for p in CORPUS[key]] if lang == "mixed" else list(CORPUS[lang])
    start = rng.randrange(len(paras))
    out: list[str] = []
    i = start
    while sum(len(p) + 2 for p in out) < n_chars:
        out.append(paras[i % len(paras)])
        i += 1
    return "\n\n".join(out)[:n_chars]


def chars_per_token(lang: str) -> float:
    """A rough figure to size a text for a token count (Gemma's tokenizer)."""
    return {"zh": 1.2, "code": 3.0, "mixed": 3.0}.get(lang, 4.0)
