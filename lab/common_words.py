"""Write rufus/retrieval/common_words.txt: the English words the typo corrector leaves alone.

A query word the catalog lacks is corrected to a near catalog word ("vaccum" -> "vacuum"), but
a real word is not a typo: "is the mattress firm or soft" must not search "fire" and show Fire
tablets. The list is the whole-word tokens of the default model's BPE vocabulary (SmolLM2,
Apache-2.0): a word of 4 or more lower-case letters that the tokenizer keeps as one token after
a space is a common written word, and typical typos ("wireles", "headphons") are not.

    python -m lab.common_words                   # from the default model built by setup
    python -m lab.common_words --tokenizer PATH  # another tokenizer.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rufus.machine.caches import default_model_dir
from rufus.retrieval.spelling import COMMON_WORDS_PATH

MIN_LETTERS = 4  # shorter words are never corrected (grounding.max_typo_distance)


def whole_words(vocab: dict[str, int]) -> list[str]:
    """Lower-case alphabetic tokens that start a word ("Ġfirm" -> "firm"), sorted."""
    out = {tok[1:] for tok in vocab
           if tok.startswith("\u0120") and len(tok) > MIN_LETTERS
           and tok[1:].isascii() and tok[1:].isalpha() and tok[1:].islower()}
    return sorted(out)


def main(argv: list[str] | None = None, doc: str = __doc__) -> int:
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--tokenizer", type=Path, default=default_model_dir() / "tokenizer.json")
    ap.add_argument("--out", type=Path, default=COMMON_WORDS_PATH)
    a = ap.parse_args(argv)
    vocab = json.loads(a.tokenizer.read_text())["model"]["vocab"]
    ws = whole_words(vocab)
    a.out.write_text(f"# {len(ws)} whole-word tokens of {a.tokenizer.parent.name}'s vocabulary "
                     "(python -m lab.common_words)\n" + "\n".join(ws) + "\n")
    print(f"wrote {len(ws)} words to {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
