"""Training data: sources (the embedded corpus, local files, chat rows, Hugging Face datasets saved to disk),
tokenized into blocks and cached for the ranks."""
