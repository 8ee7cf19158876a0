"""The plugin's rooms import one way only (ARCHITECTURE.md): the mechanisms
(``modules/``) and the model families (``models/``) import nothing from the
decoding engine (``decoding/``), which imports both; ``modules/`` imports no
model; the kernels import nothing of the plugin; ``compat/`` (fairseq's
behaviour) imports no room above it; no package imports another that imports
it back; the tooling (benchmarks, plots, fixtures) lives outside the plugin.
Read from the sources, every import (lazy ones too)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "fairseq_hardattn"
ROOMS = ("modules", "models", "decoding", "kernels", "criterions", "compat", "corpus")
# bottom to top: a room imports only rooms below it
LAYERS = ("kernels", "compat", "modules", "criterions", "models", "decoding", "corpus")


def imported_rooms(path: Path):
    """The rooms of the plugin (ROOMS, or the package's top-level modules)
    that the file at ``path`` imports."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts  # fairseq_hardattn, room, file
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = list(parts[:len(parts) - node.level]) if node.level else []
            module = base + (node.module.split(".") if node.module else [])
            names = [".".join(module + [alias.name]) for alias in node.names] if not node.module \
                else [".".join(module)]
        else:
            continue
        for name in names:
            pieces = name.split(".")
            if pieces[0] == "fairseq_hardattn" and len(pieces) > 1:
                found.add(pieces[1])
    return found - {parts[1]}


def room_imports():
    return {room: set().union(*(imported_rooms(f) for f in (PACKAGE / room).glob("*.py")))
            for room in ROOMS}


def test_the_mechanisms_and_the_models_import_nothing_from_the_engine():
    imports = room_imports()
    assert "decoding" not in imports["modules"] and "decoding" not in imports["models"], imports
    assert "models" not in imports["modules"], imports
    assert {"modules", "models"} <= imports["decoding"]
    assert not imports["kernels"] & set(ROOMS)
    assert "decoding" not in imports["criterions"]


def test_no_two_rooms_import_each_other():
    imports = room_imports()
    for room, used in imports.items():
        for other in used & set(ROOMS):
            assert room not in imports[other], (room, other)


def test_every_room_imports_only_rooms_below_it():
    imports = room_imports()
    for room, used in imports.items():
        above = set(LAYERS[LAYERS.index(room) + 1:])
        assert not used & above, (room, used & above)


def test_the_plugin_holds_no_tooling():
    assert not (PACKAGE / "tools").exists()
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        assert "hardattn_tools" not in text and "matplotlib" not in text, path
