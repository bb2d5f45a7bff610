#!/usr/bin/env python3
"""Writes scripts/data/sentences-512.txt: 512 English-like sentences of 6 to 40 words.

Deterministic (a fixed linear congruential generator, no `random` module), so the file
is the same on every machine; it is committed, and this script only documents how it
was made:  python3 scripts/gen_sentences.py > scripts/data/sentences-512.txt
"""

WORDS = """the a of and to in is was for on that with as by at from it this be are
have has had not but or an they which you one were all we their there been if more
when will would who so no she he about up out many then them these some her him into
time two like other could its than first water been people over did down only way
find use may long little very after words called just where most know get through back
much before go good new write our used me man too any day same right look think also
around another came come work three word must because does part even place well such
here take why things help put years different away again off went old number great tell
men say small every found still between name should home big give air line set own under
read last never us left end along while might next sound below saw something thought both
few those always looked show large often together asked house world going want school
important until form food keep children feet land side without boy once animals life
enough took sometimes four head above kind began almost live page got earth need far hand
high year mother light parts country father let night following picture being study second
eyes soon times story boys since white days ever paper hard near sentence better best
across during today others however sure means knew try told young miles sun ways thing
whole hear example heard several change answer room sea against top turned learn point
city play toward five using himself usually money seen car morning river engine model
memory stream tensor kernel thread batch vector cache planner garden music village market
winter summer bridge forest mountain window letter doctor teacher student question
""".split()

PUNCT = [".", ".", ".", "?", "!", ";", ","]


def lcg(seed):
    state = seed
    while True:
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        yield state >> 33


def main():
    rng = lcg(20240601)
    for _ in range(512):
        n = 6 + next(rng) % 35  # 6..40 words
        words = [WORDS[next(rng) % len(WORDS)] for _ in range(n)]
        # a comma now and then, a capital first letter, a final mark
        for i in range(2, n - 1):
            if next(rng) % 9 == 0:
                words[i] += ","
        words[0] = words[0].capitalize()
        end = PUNCT[next(rng) % 4]
        print(" ".join(words) + end)


if __name__ == "__main__":
    main()
