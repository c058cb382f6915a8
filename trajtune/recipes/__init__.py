"""The built-in recipes: TOML files, each naming an experiment and setting fields of its `Config`
(`trajtune list` shows them; `trajtune run NAME` runs one). No Python modules."""
