"""A plain accelerate training loop reporting to ftui through ``runner.track``.

    ftui run --script examples/accelerate_train.py -- --max-steps 20
    ftui run --script examples/accelerate_train.py --strategy ddp --nproc 2 -- --max-steps 20

Trains ftui's builtin tiny Llama (made offline) on the pydoc corpus. Outside ftui it runs the same
(``python examples/accelerate_train.py``, or ``accelerate launch``) and ``track`` does nothing.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=4, help="micro-batch per process")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--context-length", type=int, default=64)
    args = parser.parse_args()

    import torch
    from _tiny import tiny_model_and_blocks
    from accelerate import Accelerator

    from runner import track

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    model, _, blocks = tiny_model_and_blocks(args.context_length)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, optimizer = accelerator.prepare(model, optimizer)
    world, rank = accelerator.num_processes, accelerator.process_index
    track.start(accelerator, model=model, total_steps=args.max_steps, context_length=args.context_length)  # what is in effect; ftui checks it
    tokens = 0
    for step in range(1, args.max_steps + 1):
        # Every process takes its own rows of the step: rank r of W takes rows (s*W + r)*B ...
        first = ((step - 1) * world + rank) * args.batch_size % (len(blocks) - args.batch_size)
        batch = blocks[first:first + args.batch_size].to(accelerator.device)
        loss = model(input_ids=batch, labels=batch).loss
        accelerator.backward(loss)
        grad_norm = accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        tokens += batch.numel() * world
        mean_loss = accelerator.reduce(loss.detach(), reduction="mean").item()
        track.log({"loss": mean_loss, "lr": args.lr, "grad_norm": float(grad_norm), "tokens": tokens}, step=step)
    accelerator.end_training()


if __name__ == "__main__":
    main()
