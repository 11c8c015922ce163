"""A package with a console-script entry point (`cli-train = cli_pkg.trainer:main`), as pip installs one."""
