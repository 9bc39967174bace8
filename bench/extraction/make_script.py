"""Write bench/extraction/script.json: what the scripted chat model of bench.extraction proposes and decides.

    python -m bench.extraction.make_script [path/to/locomo10.json]

From LoCoMo's first conversation: each session observation (a sentence about one speaker, with
the `dia_id` of the turn it rests on) becomes one proposed fact at that turn. Its key is the
speaker and the first content words of the sentence ("melanie_painted_lake_sunrise_last");
its value is the sentence, which the script names by position (session, speaker, index) and the
benchmark reads from LoCoMo itself, so the dataset's text is not copied into this repository
(LoCoMo is CC BY-NC 4.0). The decision follows the key as the proposals arrive, without looking
at the stored facts: a key not proposed before is added, one proposed with another sentence
updates it, the same sentence again is none. Nothing here reads LoCoMo's questions.
"""

import json
import re
import sys
from pathlib import Path

from ..embedder import DEFAULT_TEXTS

SCRIPT = Path(__file__).with_name("script.json")
KEY_WORDS = 5
# Words that carry no content in a key ("melanie_is_a_..." says less than "melanie_painted_...").
STOP = frozenset(
    "a an the is are was were be been has have had her his their she he they it its to of and or in on at for "
    "with about from that this by as also".split()
)
LIKES = re.compile(r"\b(?:loves?|likes?|enjoys?|favou?rite|prefers?|passionate)\b", re.IGNORECASE)


def key_of(speaker, sentence):
    words = [w for w in re.findall(r"[a-z0-9]+", sentence.lower()) if w not in STOP and w != speaker.lower()]
    return "_".join([speaker.lower(), *words[:KEY_WORDS]])


def make(conversation):
    turns = {
        turn["dia_id"]
        for name, session in conversation["conversation"].items()
        if name.startswith("session_") and isinstance(session, list)
        for turn in session
    }
    script, proposed, skipped = {}, {}, 0
    sessions = sorted(conversation["observation"], key=lambda name: int(re.findall(r"\d+", name)[0]))
    pending = []
    for session in sessions:
        for speaker, items in conversation["observation"][session].items():
            for index, (sentence, dia_id) in enumerate(items):
                dia_id = str(dia_id).strip()
                if dia_id not in turns:
                    skipped += 1
                    continue
                pending.append((dia_id, session, speaker, index, sentence))

    def order(item):  # the order the turns are fed in: session, then turn
        session_number, turn_number = (int(n) for n in re.findall(r"\d+", item[0])[:2])
        return session_number, turn_number

    for dia_id, session, speaker, index, sentence in sorted(pending, key=order):
        key = key_of(speaker, sentence)
        entry = script.setdefault(dia_id, {"proposals": [], "decisions": []})
        number = len(entry["proposals"])
        entry["proposals"].append(
            {
                "key": key,
                "observation": [session, speaker, index],
                "fact_type": "user_preference" if LIKES.search(sentence) else "world_knowledge",
                "scope": "user",
            }
        )
        if key not in proposed:
            decision = {"proposal": number, "action": "add", "reason": "nothing stored under this key"}
        elif proposed[key] == sentence:
            decision = {"proposal": number, "action": "none", "reason": "already stored"}
        else:
            decision = {"proposal": number, "action": "update", "key": key, "reason": "a newer observation"}
        proposed[key] = sentence
        entry["decisions"].append(decision)
    return {
        "conversation": conversation["sample_id"],
        "made_by": "python -m bench.extraction.make_script",
        "observations_skipped": skipped,
        "turns": script,
    }


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    path = Path(argv[0]) if argv else DEFAULT_TEXTS
    conversation = json.loads(path.read_text(encoding="utf-8"))[0]
    script = make(conversation)
    SCRIPT.write_text(json.dumps(script, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    proposals = sum(len(t["proposals"]) for t in script["turns"].values())
    print(
        f"{SCRIPT.name}: {proposals} proposals at {len(script['turns'])} turns ({script['observations_skipped']} skipped)"
    )


if __name__ == "__main__":
    main()
