from pathlib import Path

import pytest

from sciformer import config
from sciformer.errors import ConfigError


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return path


def test_defaults_and_yaml12_scalars(toy_config: Path) -> None:
    exp = config.load(toy_config)
    assert exp.cfg.optimizer.lr == pytest.approx(0.01)  # "1e-2" is a float, not a string
    assert exp.cfg.train.epochs == 3 and exp.cfg.schedule.name == "cosine"
    assert exp.model_params.hidden == 8 and exp.data_params.num_classes == 3
    resolved = exp.to_dict()
    assert resolved["model"] == {"name": "toy_mlp", "hidden": 8, "dropout": 0.1}
    again = config.from_dict(resolved, exp.base_dir)
    assert again.to_dict() == resolved


def test_overrides_are_typed_and_nested(toy_config: Path) -> None:
    exp = config.load(toy_config, ["train.epochs=7", "model.hidden=4", "optimizer.betas=[0.8, 0.9]", "data.spread=0.5"])
    assert exp.cfg.train.epochs == 7 and exp.model_params.hidden == 4
    assert exp.cfg.optimizer.betas == (0.8, 0.9) and exp.data_params.spread == 0.5


@pytest.mark.parametrize(
    ("text", "overrides", "expected"),
    [
        ("train: {epocs: 3}", [], r"unknown key 'train\.epocs'; did you mean 'train\.epochs'\?"),
        ("trian: {}", [], r"unknown key 'trian'; did you mean 'train'\?"),
        ("train: {epochs: many}", [], r"train\.epochs: .*integer"),
        ("train: {epochs: 0}", [], r"train\.epochs: .*greater than or equal to 1"),
        ("model: {name: toy_mpl}", [], r"model\.name: unknown model 'toy_mpl'; did you mean 'toy_mlp'\?; valid models: .*toy_mlp"),
        ("model: {name: toy_mlp, hiden: 3}", [], r"unknown key 'model\.hiden'; did you mean 'model\.hidden'\?"),
        ("data: {name: toy_blobs, num_classes: 1}", [], r"data\.num_classes: .*greater than or equal to 2"),
        ("", ["optimizer.name=lion"], r"optimizer\.name: Input should be 'adamw', 'adam' or 'sgd'"),
        ("", ["train.monitor=f1"], r"train\.monitor must be one of"),
        ("", ["train"], r"override 'train' must look like key\.sub=value"),
        ("", ["evaluation.tta_rotations=true"], r"evaluation\.tta_rotations: expected a number, got true"),
        ("", ["train.epochs=true"], r"train\.epochs: expected a number, got true"),  # pydantic read it as 1
        ("", ["evaluation.tta_rotations=0"], r"evaluation\.tta_rotations: .*greater than or equal to 1"),
        ("", ["evaluation.overlap=4.5"], r"evaluation\.overlap: .*less than or equal to 4"),
    ],
)
def test_errors_are_one_line_and_name_the_key(tmp_path: Path, text: str, overrides: list[str], expected: str) -> None:
    base = {"data": "data: {name: toy_blobs}", "model": "model: {name: toy_mlp}"}
    lines = [text] + [v for k, v in base.items() if not text.startswith(k)]
    path = _write(tmp_path, "\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=expected) as info:
        config.load(path, overrides)
    assert "\n" not in str(info.value)


def test_missing_section_and_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="missing required key 'model'"):
        config.load(_write(tmp_path, "data: {name: toy_blobs}\n"))
    with pytest.raises(ConfigError, match="does not exist"):
        config.load(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="is a directory"):
        config.load(tmp_path)
    bad = tmp_path / "bin.yaml"
    bad.write_bytes(b"\x00\x01\x02")
    with pytest.raises(ConfigError, match="binary"):
        config.load(bad)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="not UTF-8"):
        config.load(latin)
    with pytest.raises(ConfigError, match=r"invalid YAML \(line 2, column 1\)"):
        config.load(_write(tmp_path, "data: [1, 2\n"))
    with pytest.raises(ConfigError, match="expected a mapping"):
        config.load(_write(tmp_path, "- 1\n- 2\n"))


def test_python_tags_and_alias_bombs_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="could not determine a constructor"):
        config.load(_write(tmp_path, "name: !!python/object/apply:os.system ['true']\n"))
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi")
    )
    with pytest.raises(ConfigError, match="aliases expand to more than"):
        config.load(_write(tmp_path, bomb))
