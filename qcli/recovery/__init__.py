"""Recovery: graph and weight changes that keep int8 accurate before anything goes float (README
"Recovery"; config `recovery:`). They run in a fixed order, each where its inputs exist:
equalization on the prepared float graph before calibration (weights only), SmoothQuant from
the per-channel statistics of the one calibration pass, bias correction from the quantized
model's measured output shift. A step this version does not run is refused by the schema
(`config.RECOVERY_AVAILABLE`), never silently skipped.
"""
