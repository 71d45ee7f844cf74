"""Reading finished runs: comparison tables and verdicts, repeats and noise, MFU and its peaks."""
