"""``artifactd/constants.py`` is the one reader of the environment and names every variable once.

Read from the code, not run: every module of the package is walked (its AST),
and each place that names an environment variable must name a constant of
``constants.py``, never a string of its own. Seen as naming a variable:

* the key of an environment mapping: ``environ["X"]``, ``environ.get("X")``
  (and ``pop``, ``setdefault``), ``"X" in environ``, ``{**environ, "X": ...}``,
  where the mapping is ``os.environ``, :func:`~artifactd.constants.current_environ`'s
  answer or a mapping passed in under an environment's name (``environ``,
  ``env``, ``base_env``...);
* the argument of ``os.getenv``, ``os.putenv`` and ``os.unsetenv``;
* a string of a tuple or list a loop walks to read such keys
  (``for key in (TMPDIR, "TMP"): environ.get(key)``);
* a module's own constant used as such a key (``X_VAR = "X"`` beside
  ``environ.get(X_VAR)``);
* ``envvar=`` given to click, and any ``"ARTIFACTD_..."`` literal.

And only ``constants.py`` touches ``os.environ``, ``os.environb`` or
``os.getenv``: the rest of the code takes an ``environ`` mapping or calls
:func:`~artifactd.constants.current_environ`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from test_layout import _modules

CONSTANTS = "artifactd.constants"
#: The names under which code holds an environment mapping (lower case, ``_`` stripped).
ENV_NAMES = frozenset({"environ", "environb", "env", "environment"})
#: ``os`` attributes that read or write the process environment.
OS_ENV = frozenset({"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"})


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def is_environ(node: ast.expr) -> bool:
    """Whether ``node`` is an environment: ``os.environ``, ``current_environ()``, ``env``..."""
    if isinstance(node, ast.Call):
        return _name(node.func) == "current_environ"
    name = (_name(node) or "").lower().strip("_")
    return name in ENV_NAMES or name.endswith(("_env", "_environ")) or name.startswith("env_")


def _is_os_env(node: ast.expr) -> bool:
    """Whether ``node`` is ``os.environ``, ``os.getenv`` or another reader of the process's."""
    return isinstance(node, ast.Attribute) and node.attr in OS_ENV and _name(node.value) == "os"


def _keys(node: ast.AST) -> Iterator[ast.expr]:
    """The expressions ``node`` uses as the name of an environment variable."""
    if isinstance(node, ast.Subscript) and is_environ(node.value):
        yield node.slice
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
        mapping_read = node.func.attr in {"get", "pop", "setdefault"} and is_environ(
            node.func.value
        )
        if mapping_read or _is_os_env(node.func):
            yield node.args[0]
    elif isinstance(node, ast.Compare) and any(
        isinstance(op, (ast.In, ast.NotIn)) for op in node.ops
    ):
        if any(is_environ(c) for c in node.comparators):
            yield node.left
    elif isinstance(node, ast.Dict) and any(
        k is None and is_environ(v) for k, v in zip(node.keys, node.values, strict=True)
    ):
        yield from (k for k in node.keys if k is not None)


def _module_strings(tree: ast.Module) -> dict[str, ast.Constant]:
    """The module's own ``NAME = "literal"`` assignments, by name."""
    out = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and node.targets else None
        if isinstance(node, ast.AnnAssign):
            target = node.target
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if (
            isinstance(target, ast.Name)
            and isinstance(value, ast.Constant)
            and isinstance(value.value, str)
        ):
            out[target.id] = value
    return out


def _is_own_variable(node: ast.AST) -> bool:
    """Whether ``node`` is a literal of artifactd's own variables' shape, ``"ARTIFACTD_X"``."""
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith("ARTIFACTD_")
        and node.value.replace("_", "").isalnum()
        and node.value.isupper()
    )


def _walked(tree: ast.Module, names: set[str]) -> Iterator[tuple[str, ast.expr]]:
    """Each element of a literal tuple, list or set a loop over one of ``names`` walks."""
    for node in ast.walk(tree):
        loops: list[tuple[ast.expr, ast.expr]] = []
        if isinstance(node, (ast.For, ast.AsyncFor)):
            loops.append((node.target, node.iter))
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            loops.extend((gen.target, gen.iter) for gen in node.generators)
        for target, walked in loops:
            if (
                isinstance(target, ast.Name)
                and target.id in names
                and isinstance(walked, (ast.Tuple, ast.List, ast.Set))
            ):
                yield from ((target.id, element) for element in walked.elts)


def violations(name: str, source: str) -> list[str]:
    """Every place module ``name`` (given its ``source``) names a variable itself, as messages."""
    if name == CONSTANTS:
        return []
    tree = ast.parse(source)
    own = _module_strings(tree)
    found: dict[tuple[int, str], str] = {}

    def literal(node: ast.expr, how: str) -> None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            where = (node.lineno, node.value)
            found.setdefault(where, f"{name}:{node.lineno}: {node.value!r} {how}")

    key_names: set[str] = set()  # names used as keys: a loop over literals may bind them
    for node in ast.walk(tree):
        for key in _keys(node):
            literal(key, "names an environment variable")
            if isinstance(key, ast.Name):
                key_names.add(key.id)
                if key.id in own:
                    literal(own[key.id], f"is {key.id}, an environment variable's name")
        if isinstance(node, ast.Attribute) and _is_os_env(node):
            found[(node.lineno, node.attr)] = (
                f"{name}:{node.lineno}: os.{node.attr}: read the environment through "
                "constants.current_environ() or an environ argument"
            )
        if isinstance(node, ast.keyword) and node.arg == "envvar":
            literal(node.value, "given to click as envvar=")
        if isinstance(node, ast.Constant) and _is_own_variable(node):
            literal(node, "is one of artifactd's variables")
    for target, element in _walked(tree, key_names):
        literal(element, f"is walked as {target}, an environment variable")
    return [found[k] for k in sorted(found)]


def test_every_environment_variable_is_named_in_constants() -> None:
    found = []
    for name, path in _modules().items():
        found += violations(name, path.read_text())
    assert found == [], "name these in artifactd/constants.py:\n" + "\n".join(found)


def test_constants_names_each_variable_once() -> None:
    """A second assignment of a name in ``constants.py`` would silently win over the first."""
    tree = ast.parse(_modules()[CONSTANTS].read_text())
    names = [
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    ]
    assert sorted({n for n in names if names.count(n) > 1}) == []
    values = [str(v.value) for v in _module_strings(tree).values()]
    variables = [v for v in values if v.replace("_", "").isalnum() and v.isupper()]
    assert sorted({v for v in variables if variables.count(v) > 1}) == []


def test_the_checker_sees_what_it_must_refuse() -> None:
    """Not vacuous: each way of naming a variable, planted in a module, is caught once."""
    name = "artifactd.families.base"
    source = _modules()[name].read_text()
    assert violations(name, source) == []
    planted = {
        'import os\nX = os.environ.get("C")\n': 2,  # the literal, and os.environ itself
        'import os\nX = os.getenv("HOME")\n': 2,
        'def f(environ):\n    return environ["TRITON_HOME"]\n': 1,
        'def f(env):\n    return env.get("CC", "cc")\n': 1,
        'def f(base_env):\n    return base_env.pop("TMP")\n': 1,
        'def f(environ):\n    return "HOME" in environ\n': 1,
        'def f(environ):\n    return {**environ, "TMPDIR": "/x"}\n': 1,
        'from artifactd.constants import current_environ\nX = current_environ().get("PATH")\n': 1,
        'def f(environ):\n    for k in ("USER", "LOGNAME"):\n        environ.get(k)\n': 2,
        'def f(environ):\n    return [environ[k] for k in ["A_B"] if k]\n': 1,
        'MY_VAR = "MY_VAR"\ndef f(environ):\n    return environ.get(MY_VAR)\n': 1,
        'import click\nO = click.option("--x", envvar="SOME_VAR")\n': 1,
        'X = "ARTIFACTD_NEW"\n': 1,
    }
    for code, count in planted.items():
        assert len(violations(name, source + "\n" + code)) == count, code
    named = "from artifactd.constants import HOME\ndef f(environ):\n    return environ.get(HOME)\n"
    not_env = 'def f(headers):\n    return headers.get("ETag"), headers["X"]\n'
    for code in (named, not_env):
        assert violations(name, source + "\n" + code) == [], code
