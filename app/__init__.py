"""OctoPipe's Streamlit dashboard: ``python -m streamlit run app/streamlit_app.py``."""
