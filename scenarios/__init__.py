"""The shipped studies (one scenario YAML each, and the user configs in configs/ that
configs-13b-64.yaml reads). This file makes the folder the data package zsim.scenarios
(pyproject.toml), so that an installed zsim, editable or not, carries them: `zsim report
--all` finds them through it (zsim.api.shipped_scenarios), from any working folder."""
