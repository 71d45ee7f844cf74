"""A Hugging Face ``Trainer`` script (or TRL's ``SFTTrainer`` with ``--sft``) reporting to ftui with one line:
``callbacks=[FtuiCallback()]``.

    ftui run --script examples/hf_trainer_train.py -- --max-steps 20
    ftui run --script examples/hf_trainer_train.py --strategy ddp --nproc 2 -- --max-steps 20
    ftui run --script examples/hf_trainer_train.py -- --max-steps 20 --sft     # TRL (pip install trl)

Trains ftui's builtin tiny Llama (made offline) on the pydoc corpus. Outside ftui the callback does nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=4, help="micro-batch per process")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--context-length", type=int, default=64)
    parser.add_argument("--eval-steps", type=int, default=0, help="evaluate every N steps (0: never)")
    parser.add_argument("--sft", action="store_true", help="TRL's SFTTrainer instead of Trainer")
    parser.add_argument("--output-dir", default=None)
    args = parser.parse_args()

    from _tiny import tiny_model_and_blocks

    from runner.track_hf import FtuiCallback

    model, tokenizer, blocks = tiny_model_and_blocks(args.context_length)
    rows = [{"input_ids": b, "attention_mask": [1] * len(b)} for b in blocks.tolist()]
    train_rows, eval_rows = rows[:-32], rows[-32:]
    common = dict(
        output_dir=args.output_dir or tempfile.mkdtemp(prefix="ftui-hf-"),
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size,
        learning_rate=args.lr,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        eval_strategy="steps" if args.eval_steps else "no",
        eval_steps=args.eval_steps or None,
        use_cpu=not _cuda(),
        seed=0,
    )
    callbacks = [FtuiCallback(context_length=args.context_length)]  # the one line that reports the run to ftui
    if args.sft:
        from datasets import Dataset
        from trl import SFTConfig, SFTTrainer

        trainer: object = SFTTrainer(
            model=model, processing_class=tokenizer, callbacks=callbacks,
            args=SFTConfig(**common, max_length=args.context_length, packing=False, dataset_kwargs={"skip_prepare_dataset": True}),
            train_dataset=Dataset.from_list(train_rows), eval_dataset=Dataset.from_list(eval_rows),
        )
    else:
        from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

        trainer = Trainer(
            model=model, args=TrainingArguments(**common), callbacks=callbacks,
            train_dataset=train_rows, eval_dataset=eval_rows,
            data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        )
    trainer.train()  # type: ignore[attr-defined]


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    main()
