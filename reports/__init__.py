"""Evidence packs: populations, Jinja2 templates, control mappings, renderer, manifest and verifier.

``reports.render.render_pack`` writes a pack from the store; ``reports.verify.verify_pack`` checks one
offline; ``reports.manifest`` holds the pure integrity functions both use.
"""
