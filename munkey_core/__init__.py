"""munkey_core: unlearning by design (MUNKEY key deletion) and its evidence.

The library never imports Streamlit; the dashboard and the CLI call `munkey_core.service`.
"""

from munkey_core.errors import MunkeyError

__all__ = ["MunkeyError"]
__version__ = "0.1.0"
