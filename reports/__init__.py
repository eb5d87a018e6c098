"""The shipped studies' report templates (<name>.template.md; the rest of this folder is
generated and not installed). This file makes the folder the data package zsim.reports
(pyproject.toml), installed beside zsim.scenarios, so that a scenario's
`template: ../reports/<name>.template.md` resolves in an installed zsim as it does here."""
