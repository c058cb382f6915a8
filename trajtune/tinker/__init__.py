"""The Tinker training API served by trajtune (placeholder: the lead writes this docstring)."""
