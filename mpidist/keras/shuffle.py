def install() -> None:
    pass
