"""Null-population p-value tests, one module each: is a model's Abar larger than a clean model's?
(``base.py`` says what a test is; ``NULL_TESTS`` is their registry.)"""
