"""How the web side reaches the router, and the protocol both ends speak (docs/architecture.md).

* ``client``: ``RouterClient``, what views, the API, consumers and tasks call;
* ``transport``: the ``RouterTransport`` interface and its in-process implementation;
* ``linked``, ``layer``: team mode over the router's socket and over the channel layer;
* ``placed``: several nodes' routers behind one transport;
* ``wire``: the one grant type and the answers' builders; ``messages``: the messages' types.
"""
