"""The calculator environment's demo, step 1: a word tokenizer, a tiny Llama policy warm-started
on a few tool-using transcripts, and the prompt files (training and held-out questions).

    python examples/calculator_env/prepare.py --out runs/calc

The warm start teaches the format only: in a quarter of its transcripts the policy calls the tool,
`7 * 18 = <calc> 7 * 18 </calc> <eos> <result> 126 </result> 126 <eos>` (the environment's
`<result> .. </result>` masked out of the loss, as in RL), in the others it guesses a number near
the product. So the warm-started policy sometimes calls the tool (and is then right) and mostly
guesses (and is then mostly wrong): RL on `rlhf.envs.calculator:Calculator` episodes can raise its
accuracy only by calling the tool more.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

from rlhf.models.tiny import tiny_causal_lm, word_tokenizer

WORDS = ["*", "=", "<calc>", "</calc>", "<result>", "</result>", "error"] + [str(i) for i in range(-20, 300)]


def question_split(seed: int, held_out: int = 100, draws: int = 2000) -> tuple[list[dict], list[dict]]:
    """(training rows: `draws` drawn from the questions not held out; the `held_out` questions, each
    once) over the 224 questions a * b, a in 2..9, b in 2..29: no held-out question is trained on."""
    questions = [{"prompt": f"{a} * {b} =", "answer": a * b} for a in range(2, 10) for b in range(2, 30)]
    random.Random(seed).shuffle(questions)
    rng = random.Random(seed + 1)
    return [rng.choice(questions[held_out:]) for _ in range(draws)], questions[:held_out]


def transcript(tok, row: dict, rng: random.Random, tool_share: float) -> tuple[list[int], list[int]]:
    """(token ids, loss mask): prompt (0), the policy's turns (1), the environment's reply (0)."""
    a, b = row["prompt"].split()[0], row["prompt"].split()[2]
    parts = [(row["prompt"], 0)]
    if rng.random() < tool_share:
        answer = row["answer"]
        parts += [
            (f"<calc> {a} * {b} </calc> <eos>", 1),
            (f"<result> {answer} </result>", 0),
            (f"{answer} <eos>", 1),
        ]
    else:
        parts += [(f"{row['answer'] + rng.randint(-12, 12)} <eos>", 1)]
    ids, mask = [], []
    for text, trained in parts:
        piece = tok(text, add_special_tokens=False)["input_ids"]
        ids += piece
        mask += [trained] * len(piece)
    return ids, mask


def warm_start(
    model, tok, rows: list[dict], *, steps: int, tool_share: float, seed: int, make=transcript
) -> float:
    """Plain next-token training on transcripts (`make(tok, row, rng, tool_share)`: token ids and
    loss mask; the policy's tokens only trained on); the last loss."""
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(steps):
        batch = [make(tok, rng.choice(rows), rng, tool_share) for _ in range(64)]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.full((64, width), tok.pad_token_id)
        attention = torch.zeros(64, width, dtype=torch.long)
        trained = torch.zeros(64, width)
        for i, (row_ids, row_mask) in enumerate(batch):
            ids[i, : len(row_ids)], attention[i, : len(row_ids)] = torch.tensor(row_ids), 1
            trained[i, : len(row_mask)] = torch.tensor(row_mask, dtype=torch.float)
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        loss = (nll * trained[:, 1:]).sum() / trained[:, 1:].sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    return loss.detach().item()


def arguments(out: str, steps: int) -> argparse.Namespace:
    """The command line of a calculator task's prepare step (this one's and examples/tool_agent's)."""
    parser = argparse.ArgumentParser(description="a warm-started policy and the task's prompt files")
    parser.add_argument("--out", default=out, help="directory of the policy and the prompt files")
    parser.add_argument(
        "--steps", type=int, default=steps, help="warm-start optimizer steps (64 transcripts each)"
    )
    parser.add_argument(
        "--tool-share", type=float, default=0.25, help="share of warm-start transcripts that call the tool"
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def prepare(args: argparse.Namespace, make_tokenizer, make=transcript) -> None:
    """Write the question split's prompt files and the warm-started policy (`make_tokenizer(rows)`:
    the tokenizer over every question; `make`: a transcript, as `warm_start` takes) under args.out."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    train_rows, held_out = question_split(args.seed)
    for name, rows in (("train.jsonl", train_rows), ("heldout.jsonl", held_out)):
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok = make_tokenizer(train_rows + held_out)
    model = tiny_causal_lm(tok, seed=args.seed, hidden_size=64, num_layers=2, num_heads=4)
    loss = warm_start(
        model, tok, train_rows, steps=args.steps, tool_share=args.tool_share, seed=args.seed, make=make
    )
    model.save_pretrained(out / "sft")
    tok.save_pretrained(out / "sft")
    print(
        f"warm-started policy: {out / 'sft'} (last loss {loss:.3f}); prompts: {out / 'train.jsonl'}, {out / 'heldout.jsonl'}"
    )


def main() -> None:
    prepare(arguments("runs/calc", 600), lambda rows: word_tokenizer([" ".join(WORDS)]))


if __name__ == "__main__":
    main()
