"""Reading an uploaded file once: parse it the first time its content is seen, keep a bad
file's one-line error in the session (shown on every rerun), never show a traceback."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, TypeVar

import streamlit as st

from octopipe_core.errors import OctoPipeError

T = TypeVar("T")


def parse_new(up: Any, key: str, parse: Callable[[bytes, str], T]) -> T | None:
    """``parse(raw, name)`` of the upload ``up`` when its content is new, else None; an error
    goes to ``st.session_state[key + "_error"]``."""
    ss = st.session_state
    raw = up.getvalue()
    token = hashlib.sha1(raw).hexdigest() + up.name
    if token == ss.get(f"{key}_token"):
        return None
    ss[f"{key}_token"] = token
    ss.pop(f"{key}_error", None)
    try:
        return parse(raw, up.name)
    except OctoPipeError as e:
        ss[f"{key}_error"] = str(e)
    except Exception as e:  # never a traceback for a user's file
        ss[f"{key}_error"] = f"{up.name}: could not read it ({type(e).__name__}: {e})"
    return None


def show_error(key: str) -> None:
    if st.session_state.get(f"{key}_error"):
        st.error(st.session_state[f"{key}_error"])


def forget(key: str) -> None:
    """The upload was removed: its error and token go too."""
    st.session_state.pop(f"{key}_token", None)
    st.session_state.pop(f"{key}_error", None)
