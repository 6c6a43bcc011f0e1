"""Which engines a fleet-wide LoRA adapter load or unload goes to, what its answer says, and
which remembered adapters an engine that (re)joined still lacks. Pure decisions: no I/O,
the time given.

A load goes to every engine serving the base model (or those of them the request names);
an engine that already lists the adapter is not asked again. An unload goes to every engine
listing the adapter. The answer's status: 200 when every engine succeeded, 207 (Multi-Status)
when some did and some did not, 502 when none did; each engine's outcome is in the body.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from proxy.errors import ProxyError

# An engine that failed to load a remembered adapter is asked again after this long.
RETRY_AFTER_S = 30.0


@dataclass(frozen=True, slots=True)
class Engine:
    """What the decisions need of a backend: its id and what its /v1/models lists."""

    id: str
    models: tuple[str, ...]
    adapters: frozenset[str]

    def serves_base(self, base: str) -> bool:
        return base in self.models and base not in self.adapters


@dataclass(frozen=True, slots=True)
class Adapter:
    """An adapter the fleet is to keep loaded; `backends`: the engines it was asked for,
    None for every engine serving `base` but those `excluded` (unloaded from by name)."""

    name: str
    path: str
    base: str
    backends: frozenset[str] | None = None
    excluded: frozenset[str] = frozenset()

    def loaded_on(self, path: str, chosen: Collection[str] | None) -> Adapter:
        """This adapter once loaded again (from `path`) on `chosen` (None: everywhere)."""
        if chosen is None:
            return Adapter(self.name, path, self.base)
        backends = None if self.backends is None else self.backends | set(chosen)
        return Adapter(self.name, path, self.base, backends, self.excluded - set(chosen))

    def unloaded_from(self, chosen: Collection[str]) -> Adapter:
        """This adapter once unloaded from the engines `chosen`: none of them gets it again."""
        backends = None if self.backends is None else self.backends - set(chosen)
        return Adapter(self.name, self.path, self.base, backends, self.excluded | set(chosen))


def remembered_after_load(
    before: Adapter | None, name: str, path: str, base: str, chosen: Collection[str] | None
) -> Adapter:
    """What is remembered of an adapter once it loaded on some engine."""
    if before is None or before.base != base:
        return Adapter(name, path, base, None if chosen is None else frozenset(chosen))
    return before.loaded_on(path, chosen)


@dataclass(frozen=True, slots=True)
class Outcome:
    backend: str
    ok: bool
    status: int | None  # the engine's answer's, None when it gave none
    message: str

    def view(self) -> dict[str, object]:
        return {"id": self.backend, "ok": self.ok, "status": self.status, "message": self.message}


@dataclass(frozen=True, slots=True)
class LoadPlan:
    call: list[str]  # engines to ask, in fleet order
    already: list[str]  # engines listing the adapter already


def base_model(asked: str | None, engines: Sequence[Engine]) -> str:
    """The base model a load is for: the one asked, else the fleet's only one; 400/404."""
    bases = list(dict.fromkeys(m for e in engines for m in e.models if m not in e.adapters))
    if asked is not None:
        if asked not in bases:
            raise ProxyError(
                404, f"The model `{asked}` does not exist.", type="not_found_error",
                param="base_model", code="model_not_found",
            )  # fmt: skip
        return asked
    if len(bases) == 1:
        return bases[0]
    raise ProxyError(
        400,
        f"name the adapter's base model in `base_model`: the fleet serves {', '.join(bases)}"
        if bases
        else "no backend's models are known yet; retry shortly or name `backends`",
        param="base_model",
    )


def _chosen(engines: Sequence[Engine], chosen: Collection[str] | None) -> list[Engine]:
    if chosen is None:
        return list(engines)
    known = {e.id for e in engines}
    unknown = sorted(set(chosen) - known)
    if unknown:
        raise ProxyError(400, f"no such backend(s): {', '.join(unknown)}", param="backends")
    return [e for e in engines if e.id in chosen]


def plan_load(
    name: str, base: str, engines: Sequence[Engine], chosen: Collection[str] | None
) -> LoadPlan:
    picked = [e for e in _chosen(engines, chosen) if e.serves_base(base)]
    if not picked:
        raise ProxyError(400, f"no chosen backend serves the base model `{base}`", param="backends")
    return LoadPlan(
        call=[e.id for e in picked if name not in e.models],
        already=[e.id for e in picked if name in e.models],
    )


def plan_unload(name: str, engines: Sequence[Engine], chosen: Collection[str] | None) -> list[str]:
    picked = [e.id for e in _chosen(engines, chosen) if name in e.adapters]
    if not picked:
        raise ProxyError(
            404, f"The lora adapter '{name}' cannot be found.", type="not_found_error",
            param="lora_name",
        )  # fmt: skip
    return picked


def verdict(outcomes: Sequence[Outcome]) -> int:
    """The answer's status for these engines' outcomes."""
    done = sum(o.ok for o in outcomes)
    if done == len(outcomes):
        return 200
    return 207 if done else 502


def missing(
    engine: Engine,
    remembered: Iterable[Adapter],
    asked_at: Mapping[tuple[str, str], float],
    now: float,
) -> list[Adapter]:
    """The remembered adapters `engine` should have and does not list, leaving out those it
    was asked for less than RETRY_AFTER_S ago (`asked_at`: by (engine, adapter))."""
    out: list[Adapter] = []
    for a in remembered:
        if a.name in engine.models or not engine.serves_base(a.base):
            continue
        if engine.id in a.excluded or (a.backends is not None and engine.id not in a.backends):
            continue
        last = asked_at.get((engine.id, a.name))
        if last is not None and now - last < RETRY_AFTER_S:
            continue
        out.append(a)
    return out
