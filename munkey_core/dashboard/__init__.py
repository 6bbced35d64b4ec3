"""Views shaped for the Streamlit pages and their background jobs (no Streamlit import here)."""
