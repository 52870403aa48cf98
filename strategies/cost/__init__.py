"""The cost model: hardware presets, the device mesh, and the time collectives and redistributions take.

Takes a preset name or figures and a mesh shape; gives a `Mesh` whose axes know their links (`mesh`,
`hardware`) and alpha-beta costs in seconds for collectives and placement changes (`comm`)."""
