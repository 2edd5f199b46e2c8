"""Building heads: nested heads by vocabulary trimming, the token ranking, the tiny model."""
