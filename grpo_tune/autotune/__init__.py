"""Search, refine and calibrate: plans priced by the cost model, measured, and the model fitted to them."""
