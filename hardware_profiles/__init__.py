"""The shipped hardware profiles (one YAML per cluster). This file makes the folder the
data package zsim.hardware_profiles (pyproject.toml), so that an installed zsim, editable
or not, carries its profiles; zsim.spec.registry finds them through it."""
