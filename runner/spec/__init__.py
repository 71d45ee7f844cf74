"""What a run is, as data: the recipe, the strategies table and its layout rules, the run folder and journal
formats, the checkpoint format, the run summary record and the pure launch builders. No processes, no I/O
beyond reading a recipe; everything above builds on these definitions."""
