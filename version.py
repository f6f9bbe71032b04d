"""The one version string of colibri (launcher, engine build and container converter)."""
VERSION = "0.1.0"
