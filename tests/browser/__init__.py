"""The operator console in a real headless Chromium (Playwright): what an operator sees and does, end to end."""
