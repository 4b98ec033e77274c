"""Helpers of the dashboard pages: pure (analysis, charts, tuning, exporting) and Streamlit."""
