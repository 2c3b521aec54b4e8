"""Database access: server lifecycle, migrations, connections and identity."""
