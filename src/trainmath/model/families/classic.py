FAMILIES: dict = {}


def build(cfg, name):
    raise NotImplementedError
