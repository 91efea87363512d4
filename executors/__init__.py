"""The executor API (`executors.base`) and the built-in executors."""
