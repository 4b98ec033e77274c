"""OctoPipe dashboard entrypoint: ``python -m streamlit run app/streamlit_app.py``.

The entrypoint sets up state (reading the URL's query parameters once per session), draws the
workload controls shared by every page in the sidebar, and routes to the pages in ``views/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `streamlit run` adds only app/ to sys.path
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

from app.components import display, state  # noqa: E402

st.set_page_config(page_title="OctoPipe", page_icon="🐙", layout="wide")
state.init()
state.recover_interrupted_tune()
pages = [
    st.Page(
        "views/overview.py",
        title="Overview",
        icon=":material/flag:",
        url_path="overview",
        default=True,
    ),
    st.Page("views/profile.py", title="Profile", icon=":material/table_chart:", url_path="profile"),
    st.Page("views/plan.py", title="Plan", icon=":material/build:", url_path="plan"),
    st.Page("views/tune.py", title="Tune", icon=":material/tune:", url_path="tune"),
    st.Page(
        "views/compare.py", title="Compare", icon=":material/compare_arrows:", url_path="compare"
    ),
    st.Page("views/export.py", title="Export", icon=":material/download:", url_path="export"),
    st.Page("views/cluster.py", title="Cluster", icon=":material/lan:", url_path="cluster"),
    st.Page("views/layouts.py", title="Layouts", icon=":material/grid_view:", url_path="layouts"),
]
page = st.navigation(pages)
state.sidebar(page.url_path)
with st.sidebar:
    display.follow_theme()  # charts follow the menu's theme switch
page.run()
