"""trajtune: post-train language-model policies with one weighted log-likelihood."""

__version__ = "0.1.0"
