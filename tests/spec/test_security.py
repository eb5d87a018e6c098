"""Inputs are data, never code: YAML is loaded without object construction,
scenario paths resolve against the scenario's folder and are only read, report templates
are filled by their own placeholder language, and nothing in zsim evaluates a string,
unpickles a file or starts a shell."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from zsim.errors import ConfigError
from zsim.scenario import load_scenario
from zsim.spec.hardware import HardwareProfile
from zsim.spec.yaml_file import _StrictLoader

ZSIM = Path(__file__).resolve().parents[2] / "zsim"
TAGS = ["!!python/object/apply:os.system [{cmd!r}]",
        "!!python/object/new:subprocess.Popen [[touch, {target}]]",
        "!!python/name:os.system"]


@pytest.mark.parametrize("tag", TAGS)
def test_yaml_tags_construct_nothing(tmp_path: Path, tag: str) -> None:
    target = tmp_path / "pwned"
    value = tag.format(cmd=f"touch {target}", target=target)
    scenario = tmp_path / "s.yaml"
    scenario.write_text(f"name: {value}\nmodel: 7b\nhardware: dgx-h100\n"
                        "plans: {{fsdp: {{strategy: fsdp, gpus: 8}}}}\n".replace("{{", "{")
                        .replace("}}", "}"))
    profile = tmp_path / "hw.yaml"
    profile.write_text(f"name: {value}\n")
    for load in (lambda: load_scenario(scenario), lambda: HardwareProfile.from_yaml(profile)):
        with pytest.raises(ConfigError) as e:
            load()
        assert "malformed YAML" in str(e.value)
    assert not target.exists()
    assert issubclass(_StrictLoader, yaml.SafeLoader)


def test_scenario_paths_resolve_against_the_scenario_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative model path is looked up beside the scenario, whatever the working
    folder; a file of that name in the working folder is not used."""
    (tmp_path / "cwd" / "tiny").mkdir(parents=True)
    (tmp_path / "cwd" / "tiny" / "config.json").write_text(
        '{"model_type": "llama", "hidden_size": 64, "intermediate_size": 172, '
        '"num_attention_heads": 4, '
        '"num_hidden_layers": 2, "vocab_size": 256, "max_position_embeddings": 64}')
    (tmp_path / "scenarios").mkdir()
    scenario = tmp_path / "scenarios" / "s.yaml"
    scenario.write_text("name: s\nmodel: tiny/config.json\nhardware: dgx-h100\n"
                        "plans: {fsdp: {strategy: fsdp, gpus: 8}}\n")
    monkeypatch.chdir(tmp_path / "cwd")
    with pytest.raises(ConfigError) as e:
        load_scenario(scenario)
    assert e.value.field == "model"


def _calls(tree: ast.AST) -> list[tuple[str, ast.Call]]:
    """Every call in `tree` with its dotted callee name (e.g. "os.system")."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            parts = []
            f = node.func
            while isinstance(f, ast.Attribute):
                parts.append(f.attr)
                f = f.value
            if isinstance(f, ast.Name):
                parts.append(f.id)
            out.append((".".join(reversed(parts)), node))
    return out


def test_no_code_runs_from_strings_and_no_shell_starts() -> None:
    forbidden = {"eval", "exec", "compile", "os.system", "os.popen", "pickle.load",
                 "pickle.loads", "yaml.unsafe_load", "yaml.full_load", "subprocess.run",
                 "subprocess.call", "subprocess.check_call", "subprocess.check_output",
                 "subprocess.Popen", "__import__"}
    found = []
    for path in sorted(ZSIM.rglob("*.py")):
        for name, call in _calls(ast.parse(path.read_text())):
            if name in forbidden:
                found.append(f"{path.relative_to(ZSIM)}:{call.lineno} {name}")
            if name == "yaml.load":  # only with the safe loader
                loader = next((k.value for k in call.keywords if k.arg == "Loader"), None)
                if not (isinstance(loader, ast.Name) and loader.id == "_StrictLoader"):
                    found.append(f"{path.relative_to(ZSIM)}:{call.lineno} yaml.load")
            if any(k.arg == "shell" for k in call.keywords):
                found.append(f"{path.relative_to(ZSIM)}:{call.lineno} shell=")
    assert not found, found


def test_a_template_placeholder_is_not_python(tmp_path: Path) -> None:
    import pandas as pd

    from zsim.report.markdown import render_report

    frame = pd.DataFrame([{"run": "fsdp", "mfu": 0.5}])
    with pytest.raises(ConfigError) as e:
        render_report("{{ __import__('os').system('touch x') }}", frame, {})
    assert e.value.field == "report.template"
    assert not (tmp_path / "x").exists() and not Path("x").exists()
