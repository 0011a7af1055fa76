"""Bad-input matrix: generated damaged traces and the outcome every command must give."""
