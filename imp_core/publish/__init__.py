"""Published sketch versions: the manifests imp's Spark extension applies (docs/ARCHITECTURE.md, "Queries from any
client"). ``manifest.py`` builds one from a committed version, ``store.py`` writes and lists them at the publish
location, ``publisher.py`` publishes after every commit, ``signature.py`` computes a query's plan signature with
the extension's own code, ``applications.py`` reads how often the extension applied each sketch."""
