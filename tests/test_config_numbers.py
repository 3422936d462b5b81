"""No true/false where a config number goes (pydantic's lax mode would read true as 1)."""

from __future__ import annotations

from pydantic import BaseModel

from sciformer.config_numbers import bool_for_number, number_only


class Inner(BaseModel):
    seed: int | None = None
    flip: bool = False


class Outer(BaseModel):
    epochs: int = 3
    lr: float = 0.1
    name: str = "x"
    sizes: list[int] = []
    flag: bool = True
    inner: Inner = Inner()
    maybe: Inner | None = None


def test_number_only_types() -> None:
    assert number_only(int) and number_only(float) and number_only(int | None) and number_only(int | float)
    assert not number_only(bool) and not number_only(str) and not number_only(int | str) and not number_only(list[int])


def test_the_first_bool_for_a_number_is_named_with_its_path() -> None:
    assert bool_for_number(Outer, {"epochs": True}, "train") == "train.epochs: expected a number, got true"
    assert bool_for_number(Outer, {"lr": False}, "optimizer") == "optimizer.lr: expected a number, got false"
    assert bool_for_number(Outer, {"inner": {"seed": True}}, "data") == "data.inner.seed: expected a number or null, got true"
    assert bool_for_number(Outer, {"maybe": {"seed": False}}, "data") == "data.maybe.seed: expected a number or null, got false"
    # bools where bools go, numbers where numbers go, unknown keys and non-mappings: left to pydantic
    assert bool_for_number(Outer, {"flag": True, "inner": {"flip": True}, "epochs": 1, "lr": 1, "name": "true",
                                   "sizes": [True], "unknown": True}, "x") is None
    assert bool_for_number(Outer, None, "x") is None and bool_for_number(Outer, {"inner": 5}, "x") is None
