def build(cfg, name):
    raise NotImplementedError
