"""The inventory branch's revision files."""
