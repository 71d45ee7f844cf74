"""Training data: sources (the embedded corpus, local files, chat rows, Hugging Face datasets saved to disk),
tokenized into blocks and cached for the ranks.

The modules depend one way, each on those listed before it: ``chat`` (row formats, tokenizing with labels)
and ``hf_datasets`` (datasets read offline); ``rows`` (kinds of source, every row of one, a row's text;
:class:`~runner.data.rows.DataError`); ``blocks`` (token blocks); ``cache`` (the tokenized-data cache);
``check`` (the pre-launch check) and ``prepare`` (the data step the trainer and the pre-flight run).
"""
