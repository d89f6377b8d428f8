import os
import sys

# Test helpers (oracle.py, cases.py) are imported as plain modules.
sys.path.insert(0, os.path.dirname(__file__))
