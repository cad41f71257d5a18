"""burnish's domain: policies and their settings, recorded calls, group states, settings, errors.

The bottom layer. It imports the standard library and msgspec only: no web framework, no
database, no torch. Every other layer imports it; it imports none of them.
"""
