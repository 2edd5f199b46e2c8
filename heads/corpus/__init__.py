"""The corpus: sources (English, localized), text extraction, roff, the train/held-out
splits, the build, and the per-language samples."""
